"""The command line: overrides parsing, early validation, and generate/bench end to end on a tiny
model saved as a Hugging Face directory (no network, no real model)."""

from __future__ import annotations

import json

import pytest

from specserve.cli import main, parse_overrides


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
        (["--strategy", "foo"], "valid strategies: ar, lookahead, prompt_lookup"),
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
    assert "valid: hf_ar, hf_pld" in capsys.readouterr().err


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
            "hf_ar,hf_pld",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert {"model", "device", "prompts", "max_new_tokens", "results"} <= set(report)
    assert report["prompts"] == 2 and report["max_new_tokens"] == 6
    assert set(report["results"]) == {"ar", "prompt_lookup", "lookahead", "hf_ar", "hf_pld"}
    for name, r in report["results"].items():
        assert set(r) == {"tok_s", "tau", "speedup_vs_hf_ar", "identical_to_ar", "by_task"}
        assert set(r["by_task"]) == {"alpha", "beta"}
        assert r["identical_to_ar"] is True, name
    assert report["results"]["hf_ar"]["speedup_vs_hf_ar"] == 1.0
