"""Fixtures of the command-line tests: the CLI in its exact mode, a tiny model saved as a Hugging
Face directory, and a LoRA adapter `specserve finetune` trained on it."""

from __future__ import annotations

import json

import pytest

from specserve.cli import main as cli_main

MODEL_COMMANDS = ("generate", "bench", "tune", "train-drafter", "finetune")


def exact_main(argv: list[str]) -> int:
    """The CLI in its exact mode (float32) unless a test names a dtype: the default `auto` would
    measure the tiny model and might pick bfloat16, whose outputs equal ar's only up to ties."""
    if argv and argv[0] in MODEL_COMMANDS and "--dtype" not in argv:
        argv = [*argv, "--dtype", "float32"]
    return cli_main(argv)


@pytest.fixture(scope="session")
def main():
    """`main(argv) -> exit code`: the CLI, float32 unless argv names a dtype."""
    return exact_main


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, save_tiny_model_dir):
    return save_tiny_model_dir(tmp_path_factory.mktemp("cli-model"))


@pytest.fixture(scope="session")
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
    code = exact_main(
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
