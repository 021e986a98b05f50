"""`specserve finetune` writes a valid adapter (bad config refused); `train-drafter` trains both
kinds on a tiny model, and bench and generate decode with them."""

from __future__ import annotations

import json


def test_finetune_writes_a_valid_adapter(finetuned, capsys):
    assert (finetuned / "adapter_model.safetensors").is_file()
    record = json.loads((finetuned / "specserve-finetune.json").read_text())
    assert record["steps"] > 0 and record["data"]["examples"] == 8


def test_finetune_refuses_bad_config(capsys, tmp_path, model_dir, main):
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


def test_train_drafter_then_bench_with_drafters(tmp_path, model_dir, capsys, main):
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
    # one cache for held-out and training sequences and both kinds (entries keyed by tokens)
    assert len(list((cache / "teacher").glob("teacher-*"))) == 1
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
