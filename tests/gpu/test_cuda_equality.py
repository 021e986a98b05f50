"""GPU: on CUDA (fp32, so the comparison is exact), every tree strategy reproduces `ar` on a tiny
model with wide padded verify forwards. The real model's bf16 run is scripts/gpu/bench.sh."""

from __future__ import annotations

import copy

import pytest
import torch

from specserve.engine.decode.engine import Engine
from specserve.engine.sampling import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_tree_strategies_equal_ar_on_cuda(tiny_llama, tokenizer):
    model = copy.deepcopy(tiny_llama(seed=3)).cuda()  # the fixture's models are shared: copy
    engine = Engine(model, tokenizer, frozenset(), pad_width=lambda k: max(k, 32))
    prompt = [int(t) for t in torch.randint(0, 96, (30,))] * 3
    params = SamplingParams(max_new_tokens=64)
    ref = engine.generate(prompt, params, "ar")
    for strategy, cfg in (
        ("prompt_lookup", {"draft_len": 8, "max_matches": 4}),
        ("lookahead", {"window": 8, "ngram": 5, "guesses": 8}),
    ):
        assert engine.generate(prompt, params, strategy, cfg).output_ids == ref.output_ids
