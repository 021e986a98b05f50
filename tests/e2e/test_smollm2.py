"""Slow: the real SmolLM2-135M-Instruct (pulled into the cache) decodes identically with every
strategy, including the device-tuned padding, and the CLI streams a completion."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specserve.engine.decode.engine import Engine
from specserve.engine.prompts import encode_chat
from specserve.engine.sampling import SamplingParams
from specserve.models.load import load_model

pytestmark = pytest.mark.slow
BENCH = Path(__file__).resolve().parents[3] / "shared" / "bench" / "specbench_dev.jsonl"


@pytest.fixture(scope="module")
def loaded():
    return load_model("smollm2-135m", device="cpu")


def _prompts(tokenizer, n_per_task: int = 1) -> list[list[int]]:
    rows, seen = [], {}
    for line in BENCH.read_text().splitlines():
        row = json.loads(line)
        if seen.setdefault(row["task"], 0) < n_per_task:
            seen[row["task"]] += 1
            rows.append(encode_chat(tokenizer, [{"role": "user", "content": row["turns"][0]}]))
    return rows


@pytest.mark.skipif(not BENCH.exists(), reason="Spec-Bench prompts not beside the checkout")
def test_strategies_identical_on_real_model(loaded):
    engine = Engine.from_loaded(loaded, pad_width=lambda k: max(k, 5))
    params = SamplingParams(max_new_tokens=48)
    for ids in _prompts(loaded.tokenizer)[:3]:
        ref = engine.generate(ids, params, "ar")
        for strategy, cfg in (("prompt_lookup", {}), ("lookahead", {"window": 4, "ngram": 4})):
            got = engine.generate(ids, params, strategy, cfg)
            assert got.output_ids == ref.output_ids, strategy


def test_ar_matches_hf_generate(loaded):
    ids = encode_chat(loaded.tokenizer, [{"role": "user", "content": "Name three colours."}])
    ours = Engine.from_loaded(loaded).generate(ids, SamplingParams(max_new_tokens=32), "ar")
    with torch.inference_mode():
        ref = loaded.model.generate(
            torch.tensor([ids]),
            max_new_tokens=32,
            do_sample=False,
            eos_token_id=sorted(loaded.eos_token_ids),
            pad_token_id=2,
        )
    assert ours.output_ids == ref[0, len(ids) :].tolist()


def test_cli_generate_streams(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "specserve.cli",
            "generate",
            "--prompt",
            "What is 2 + 2?",
            "--strategy",
            "lookahead",
            "--max-new-tokens",
            "24",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert out.stdout.strip()
    assert "tau" in out.stderr
