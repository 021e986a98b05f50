"""`specserve generate`: early validation of its flags, and streaming on a tiny model saved as a
Hugging Face directory (no network, no real model), lossless with and without an adapter."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "args, field",
    [
        (
            ["--strategy", "foo"],
            "valid strategies: ar, eagle, hybrid, lookahead, medusa, prompt_lookup",
        ),
        (["--config", "windw=3"], "windw"),
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "1.5"], "top_p"),
        (["--max-new-tokens", "0"], "max_new_tokens"),
        (["--model", "no-such-model"], "known catalog names: smollm2-135m"),
    ],
)
def test_generate_bad_input_names_the_field(capsys, tmp_path, args, field, main):
    code = main(["generate", "--prompt", "hi", "--cache-dir", str(tmp_path), *args])
    assert code == 2
    assert field in capsys.readouterr().err


def test_generate_streams_on_a_tiny_model(capsys, tmp_path, model_dir, main):
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


def test_generate_with_adapter_is_lossless_and_applies(
    capsys, tmp_path, model_dir, finetuned, main
):
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


def test_generate_refuses_a_pickle_adapter(capsys, tmp_path, model_dir, finetuned, main):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(finetuned, bad)
    (bad / "adapter_model.bin").write_bytes(b"\x80\x04.")
    argv = ["generate", "--model", str(model_dir), "--prompt", "w1", "--raw", "--adapter", str(bad)]
    assert main(argv) == 2
    assert "pickle" in capsys.readouterr().err
