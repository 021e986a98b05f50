"""The command line: overrides parsing, early validation, and generate/bench end to end on a tiny
model saved as a Hugging Face directory (no network, no real model)."""

from __future__ import annotations

import json

import pytest

from specserve.cli import main as cli_main
from specserve.cli import parse_overrides

MODEL_COMMANDS = ("generate", "bench", "tune", "train-drafter", "finetune")


def main(argv: list[str]) -> int:
    """The CLI in its exact mode (float32) unless a test names a dtype: the default `auto` would
    measure the tiny model and might pick bfloat16, whose outputs equal ar's only up to ties."""
    if argv and argv[0] in MODEL_COMMANDS and "--dtype" not in argv:
        argv = [*argv, "--dtype", "float32"]
    return cli_main(argv)


def test_parse_overrides():
    assert parse_overrides(["window=5", "seed_from_prompt=false", "x=abc"], scoped=False) == {
        "window": 5,
        "seed_from_prompt": False,
        "x": "abc",
    }
    assert parse_overrides(["lookahead.window=5"], scoped=True) == {"lookahead": {"window": 5}}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_overrides(["window"], scoped=False)
    with pytest.raises(ValueError, match="STRATEGY.KEY=VALUE"):
        parse_overrides(["window=5"], scoped=True)


@pytest.mark.parametrize(
    "args, field",
    [
        (["--strategy", "foo"], "valid strategies: ar, eagle, lookahead, medusa, prompt_lookup"),
        (["--config", "windw=3"], "windw"),
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "1.5"], "top_p"),
        (["--max-new-tokens", "0"], "max_new_tokens"),
        (["--model", "no-such-model"], "known catalog names: smollm2-135m"),
    ],
)
def test_generate_bad_input_names_the_field(capsys, tmp_path, args, field):
    code = main(["generate", "--prompt", "hi", "--cache-dir", str(tmp_path), *args])
    assert code == 2
    assert field in capsys.readouterr().err


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, save_tiny_model_dir):
    return save_tiny_model_dir(tmp_path_factory.mktemp("cli-model"))


def test_generate_streams_on_a_tiny_model(capsys, tmp_path, model_dir):
    argv = [
        "generate",
        "--model",
        str(model_dir),
        "--cache-dir",
        str(tmp_path),
        "--raw",
        "--prompt",
        "w1 w2 w3 w1 w2 w3 w1 w2",
        "--max-new-tokens",
        "12",
    ]
    assert main(argv + ["--strategy", "ar"]) == 0
    ar = capsys.readouterr()
    assert main(argv + ["--strategy", "prompt_lookup"]) == 0
    pl = capsys.readouterr()
    assert pl.out == ar.out  # lossless: identical text
    assert "[prompt_lookup] 12 tokens" in pl.err


def test_bench_rejects_unknown_baseline(capsys, tmp_path):
    code = main(["bench", "--baselines", "hf_ar,vllm", "--cache-dir", str(tmp_path)])
    assert code == 2
    assert "valid: hf_ar, hf_pld, hf_ar_fp32" in capsys.readouterr().err


def test_bench_report_contract(tmp_path, model_dir):
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
            "ar,prompt_lookup,lookahead",
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
    assert report["prompts"] == 2 and report["max_new_tokens"] == 6
    assert set(report["results"]) == {
        "ar", "prompt_lookup", "lookahead", "hf_ar", "hf_pld", "hf_ar_fp32"
    }  # fmt: skip
    common = {"tok_s", "tau", "speedup_vs_hf_ar", "identical_to_ar", "by_task"}
    contract = {"divergences", "max_tie_gap", "all_ties"}
    ours = {"mean_padded_width", "predicted_speedup", "efficiency", "efficiency_vs_hf_ar"}
    for name, r in report["results"].items():
        expected = common | (ours if name in ("ar", "prompt_lookup", "lookahead") else set())
        expected |= contract if name not in ("ar", "hf_ar_fp32") else set()
        assert set(r) == expected, name
        assert set(r["by_task"]) == {"alpha", "beta"}
        assert r["identical_to_ar"] is True, name
        if name in contract:
            assert r["divergences"] == [] and r["all_ties"] is True
    assert report["results"]["hf_ar"]["speedup_vs_hf_ar"] == 1.0
    assert report["results"]["ar"]["efficiency"] == 1.0
    assert report["tie_tolerance"]["tolerance"] < 1e-4  # fp32: rounding noise only


def test_compile_on_measures_and_auto_follows_the_measurement(capsys, tmp_path, model_dir):
    """`tune --compile on` compiles, measures and caches; `auto` then decides from that record
    (in float32 only a bit-exact compiled forward may serve)."""
    argv = ["tune", "--model", str(model_dir), "--cache-dir", str(tmp_path), "--no-tune"]
    argv += ["--strategies", "ar"]
    assert main(argv + ["--compile", "on"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["compile"]["enabled"] is True
    record = out["compile"]["record"]
    assert record["graphs"] == 2 and record["compiled_ms"]["1"] > 0 and record["start_s"] > 0
    assert len(list((tmp_path / "costs").glob("compile-*.json"))) == 1
    assert main(argv) == 0  # --compile auto
    captured = capsys.readouterr()
    decision = json.loads(captured.out)["compile"]
    exact = record["max_abs_diff"] == 0.0
    gain = record["eager_ms"]["1"] / record["compiled_ms"]["1"]
    assert decision["enabled"] is (exact and gain >= 1.05)
    assert "auto: measured compiled" in decision["reason"]
    assert f"compile {'on' if decision['enabled'] else 'off'} (auto: measured" in captured.err


def test_bench_in_bf16_reports_divergences_as_ties(tmp_path, model_dir):
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


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, model_dir):
    """`specserve finetune` on the tiny model dir: a real adapter directory."""
    tmp = tmp_path_factory.mktemp("finetune")
    data = tmp / "data.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"text": " ".join(f"w{(i * 7 + j) % 60}" for j in range(40))})
            for i in range(8)
        )
    )
    out = tmp / "adapters" / "demo"
    code = main(
        [
            "finetune",
            "--model",
            str(model_dir),
            "--cache-dir",
            str(tmp),
            "--data",
            str(data),
            "--out",
            str(out),
        ]
        + ["--budget-minutes", "0.5", "--config", "epochs=2", "--config", "learning_rate=0.05"]
    )
    assert code == 0
    return out


def test_finetune_writes_a_valid_adapter(finetuned, capsys):
    assert (finetuned / "adapter_model.safetensors").is_file()
    record = json.loads((finetuned / "specserve-finetune.json").read_text())
    assert record["steps"] > 0 and record["data"]["examples"] == 8


def test_finetune_refuses_bad_config(capsys, tmp_path, model_dir):
    data = tmp_path / "d.txt"
    data.write_text("w1 w2")
    argv = [
        "finetune",
        "--model",
        str(model_dir),
        "--data",
        str(data),
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(argv + ["--config", "rnak=4"]) == 2
    assert "rnak" in capsys.readouterr().err


def test_generate_with_adapter_is_lossless_and_applies(capsys, tmp_path, model_dir, finetuned):
    argv = ["generate", "--model", str(model_dir), "--cache-dir", str(tmp_path), "--raw"]
    argv += ["--prompt", "w1 w8 w15 w22", "--max-new-tokens", "12"]
    outs = {}
    for strategy in ["ar", "lookahead"]:
        for adapter in [None, finetuned]:
            assert (
                main(
                    argv
                    + ["--strategy", strategy]
                    + (["--adapter", str(adapter)] if adapter else [])
                )
                == 0
            )
            outs[strategy, adapter is not None] = capsys.readouterr().out
    assert outs["ar", True] == outs["lookahead", True]
    assert outs["ar", False] == outs["lookahead", False]
    assert outs["ar", True] != outs["ar", False]


def test_generate_refuses_a_pickle_adapter(capsys, tmp_path, model_dir, finetuned):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(finetuned, bad)
    (bad / "adapter_model.bin").write_bytes(b"\x80\x04.")
    argv = ["generate", "--model", str(model_dir), "--prompt", "w1", "--raw", "--adapter", str(bad)]
    assert main(argv) == 2
    assert "pickle" in capsys.readouterr().err


def test_bench_with_adapter_runs_every_method_on_the_variant(tmp_path, model_dir, finetuned):
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


def test_train_drafter_then_bench_with_drafters(tmp_path, model_dir, capsys):
    """Both kinds train on the tiny model within a few seconds, are saved with a manifest, and
    bench decodes with them (identical to ar) and reports their manifests."""
    cache = tmp_path / "cache"
    for kind in ("medusa", "eagle"):
        code = main(
            [
                "train-drafter",
                "--model",
                str(model_dir),
                "--cache-dir",
                str(cache),
                "--kind",
                kind,
                "--out",
                str(tmp_path / "drafters" / kind),
                "--budget-minutes",
                "0.05",
            ]
        )
        assert code == 0
        manifest = json.loads((tmp_path / "drafters" / kind / "manifest.json").read_text())
        assert manifest["kind"] == kind and manifest["adapter_sha256"] is None
        assert manifest["heldout_tau"] >= 1.0
        assert manifest["training"]["examples"] > 0
    assert len(list((cache / "distill").glob("distill-*.pt"))) == 1  # shared by both kinds
    data = tmp_path / "bench.jsonl"
    rows = [{"question_id": i, "task": "alpha", "turns": [f"w{i} w{i + 1} w{i}"]} for i in (3, 4)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "report.json"
    argv = [
        "bench",
        "--model",
        str(model_dir),
        "--cache-dir",
        str(cache),
        "--data",
        str(data),
        "--per-task",
        "2",
        "--max-new-tokens",
        "6",
        "--no-tune",
        "--baselines",
        "hf_ar",
        "--strategies",
        "ar,medusa,eagle",
        "--drafter-dir",
        str(tmp_path / "drafters"),
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert set(report["results"]) == {"ar", "medusa", "eagle", "hf_ar"}
    for name in ("medusa", "eagle"):
        assert report["results"][name]["identical_to_ar"] is True
        assert report["drafters"][name]["kind"] == name
    assert "total_tokens" in report["strategy_configs"]["eagle"]
    assert "tree_size" in report["strategy_configs"]["medusa"]
    gen = [
        "generate",
        "--model",
        str(model_dir),
        "--cache-dir",
        str(cache),
        "--raw",
        "--prompt",
        "w1 w2 w3 w1 w2",
        "--max-new-tokens",
        "8",
    ]
    capsys.readouterr()
    assert main(gen + ["--strategy", "ar"]) == 0
    ar = capsys.readouterr().out
    assert main(gen + ["--strategy", "eagle", "--drafter-dir", str(tmp_path / "drafters")]) == 0
    assert capsys.readouterr().out == ar


def test_bench_refuses_a_drafter_for_another_model(tmp_path, model_dir, capsys):
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


def test_bench_drafter_strategy_needs_drafter_dir(tmp_path, capsys):
    assert main(["bench", "--strategies", "ar,eagle", "--cache-dir", str(tmp_path)]) == 2
    assert "need --drafter-dir" in capsys.readouterr().err


def test_variants_list_pages_through_the_admin_api(capsys, monkeypatch, tmp_path):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from specserve.adapters.settings import AdapterLimits
    from specserve.platform.api.admin import Admin, admin_router
    from specserve.platform.api.client import AdminClient
    from specserve.platform.state.registry import Registry, VariantSpec
    from specserve.platform.state.store import MemoryStore
    from specserve.policies.settings import PolicySettings

    registry = Registry(MemoryStore())
    names = [f"v{i:03d}" for i in range(230)]
    for name in names:
        registry.register(
            VariantSpec(name=name, base_model="m", adapter_path="/a", adapter_sha256="ab" * 32)
        )
    admin = Admin(registry, "tok", {}, AdapterLimits(root=tmp_path), PolicySettings())
    app = FastAPI()
    app.include_router(admin_router(admin))
    http = TestClient(app)  # AdminClient.call is routed here
    paths = []

    def call(self, method, path, body=None):
        paths.append(path)
        r = http.request(
            method, f"/admin{path}", json=body, headers={"Authorization": "Bearer tok"}
        )
        assert r.status_code == 200, r.text
        return r.json()

    monkeypatch.setattr(AdminClient, "call", call)
    argv = ["variants", "list", "--url", "http://x", "--token", "tok", "--cache-dir", str(tmp_path)]
    assert cli_main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [v["name"] for v in out["variants"]] == names and out["has_more"] is False
    assert len(paths) == 3  # pages of 100
    assert cli_main([*argv, "--limit", "120", "--after", "v009"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [v["name"] for v in out["variants"]] == names[10:130]
    assert out["has_more"] is True and out["last_id"] == "v129"
    assert cli_main([*argv, "--limit", "0"]) == 2
