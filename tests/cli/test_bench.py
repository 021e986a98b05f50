"""`specserve bench`: name checks before loading, and the JSON report's contract end to end on a
tiny model (float32 and bf16, with an adapter, with drafters of another model refused)."""

from __future__ import annotations

import json


def test_bench_rejects_unknown_baseline(capsys, tmp_path, main):
    code = main(["bench", "--baselines", "hf_ar,vllm", "--cache-dir", str(tmp_path)])
    assert code == 2
    assert "valid: hf_ar, hf_pld, hf_ar_fp32" in capsys.readouterr().err


def test_bench_report_contract(tmp_path, model_dir, main):
    """Tiny model, two made-up tasks: the JSON has exactly the documented keys."""
    data = tmp_path / "bench.jsonl"
    rows = [
        {"question_id": i, "task": task, "turns": [f"w{i} w{i + 1} w{i} w{i + 1}"]}
        for i, task in enumerate(["alpha", "alpha", "beta"], start=3)
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "report.json"
    code = main(
        [
            "bench",
            "--model",
            str(model_dir),
            "--cache-dir",
            str(tmp_path),
            "--data",
            str(data),
            "--per-task",
            "1",
            "--max-new-tokens",
            "6",
            "--no-tune",
            "--strategies",
            "ar,prompt_lookup,lookahead,hybrid",
            "--baselines",
            "hf_ar,hf_pld,hf_ar_fp32",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert {"model", "device", "prompts", "max_new_tokens", "results"} <= set(report)
    assert {"dtype", "dtype_choice", "compile", "tie_tolerance", "cost_curve_ms"} <= set(report)
    assert report["compile"]["enabled"] is False  # auto, nothing measured in this cache
    assert report["dtype"] == "torch.float32"
    assert report["pool"] == "fresh"  # one n-gram pool per prompt unless --pool warm
    assert report["prompts"] == 2 and report["max_new_tokens"] == 6
    assert set(report["results"]) == {
        "ar", "prompt_lookup", "lookahead", "hybrid", "hf_ar", "hf_pld", "hf_ar_fp32"
    }  # fmt: skip
    common = {"tok_s", "tau", "speedup_vs_hf_ar", "identical_to_ar", "by_task"}
    contract = {"divergences", "max_tie_gap", "all_ties"}
    ours = {"mean_padded_width", "predicted_speedup", "efficiency", "efficiency_vs_hf_ar"}
    ours |= {"draft_cost"}  # decode steps' drafting seconds / verify seconds
    for name, r in report["results"].items():
        expected = common | (
            ours if name in ("ar", "prompt_lookup", "lookahead", "hybrid") else set()
        )
        expected |= contract if name not in ("ar", "hf_ar_fp32") else set()
        expected |= {"accepted_by_source"} if name == "hybrid" else set()
        assert set(r) == expected, name
        assert set(r["by_task"]) == {"alpha", "beta"}
        assert r["identical_to_ar"] is True, name
        if name in contract:
            assert r["divergences"] == [] and r["all_ties"] is True
    hybrid = report["results"]["hybrid"]
    assert set(hybrid["accepted_by_source"]) == {"eagle", "prompt", "pool"}
    assert hybrid["accepted_by_source"]["eagle"] == 0  # no drafter given
    assert report["results"]["hf_ar"]["speedup_vs_hf_ar"] == 1.0
    assert report["results"]["ar"]["efficiency"] == 1.0
    assert report["tie_tolerance"]["tolerance"] < 1e-4  # fp32: rounding noise only


def test_bench_in_bf16_reports_divergences_as_ties(tmp_path, model_dir, main):
    """bf16: the report names the dtype, the float32 baseline is another model, and whatever
    differs from ar is checked against the measured tolerance."""
    data = tmp_path / "bench.jsonl"
    rows = [{"question_id": i, "task": "t", "turns": [f"w{i} w{i + 1} " * 6]} for i in range(3, 7)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "report.json"
    argv = ["bench", "--model", str(model_dir), "--cache-dir", str(tmp_path), "--data", str(data)]
    argv += ["--per-task", "4", "--max-new-tokens", "12", "--no-tune", "--dtype", "bfloat16"]
    argv += ["--baselines", "hf_ar,hf_ar_fp32", "--strategies", "ar,prompt_lookup"]
    assert main(argv + ["--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["dtype"] == "torch.bfloat16"
    assert report["dtype_choice"] == {"chosen": "torch.bfloat16", "reason": "--dtype bfloat16"}
    assert 0 <= report["tie_tolerance"]["tolerance"] < 1.0
    pl = report["results"]["prompt_lookup"]
    assert pl["all_ties"] is True and pl["identical_to_ar"] == (pl["divergences"] == [])
    assert report["results"]["hf_ar_fp32"]["tok_s"] > 0


def test_bench_with_adapter_runs_every_method_on_the_variant(tmp_path, model_dir, finetuned, main):
    data = tmp_path / "bench.jsonl"
    data.write_text(
        json.dumps({"question_id": 1, "task": "alpha", "turns": ["w1 w8 w15 w22 w1 w8"]})
    )
    out = tmp_path / "report.json"
    argv = ["bench", "--model", str(model_dir), "--cache-dir", str(tmp_path), "--data", str(data)]
    argv += ["--per-task", "1", "--max-new-tokens", "8", "--no-tune", "--out", str(out)]
    assert main(argv + ["--adapter", str(finetuned)]) == 0
    report = json.loads(out.read_text())
    assert (
        report["adapter"]["path"] == str(finetuned.resolve())
        and len(report["adapter"]["sha256"]) == 64
    )
    assert all(r["identical_to_ar"] for r in report["results"].values())
    assert set(report["results"]) == {"ar", "prompt_lookup", "lookahead", "hf_ar", "hf_pld"}


def test_bench_refuses_a_drafter_for_another_model(tmp_path, model_dir, capsys, main):
    other = tmp_path / "other"
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM.from_pretrained(str(model_dir)).save_pretrained(str(other))
    import shutil

    for f in model_dir.iterdir():
        if "token" in f.name:
            shutil.copy(f, other / f.name)
    cfg = LlamaConfig.from_pretrained(str(other))
    import torch

    torch.manual_seed(9)
    LlamaForCausalLM(cfg).save_pretrained(str(other))  # same architecture, other weights
    cache = tmp_path / "cache"
    assert (
        main(
            [
                "train-drafter",
                "--model",
                str(other),
                "--cache-dir",
                str(cache),
                "--kind",
                "medusa",
                "--out",
                str(tmp_path / "d" / "medusa"),
                "--budget-minutes",
                "0.05",
            ]
        )
        == 0
    )
    code = main(
        [
            "bench",
            "--model",
            str(model_dir),
            "--cache-dir",
            str(cache),
            "--no-tune",
            "--strategies",
            "ar,medusa",
            "--drafter-dir",
            str(tmp_path / "d"),
        ]
    )
    assert code == 2
    assert "base model weights differ" in capsys.readouterr().err


def test_bench_drafter_strategy_needs_drafter_dir(tmp_path, capsys, main):
    assert main(["bench", "--strategies", "ar,eagle", "--cache-dir", str(tmp_path)]) == 2
    assert "need --drafter-dir" in capsys.readouterr().err
