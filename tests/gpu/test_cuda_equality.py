"""GPU: on CUDA (fp32, so the comparison is exact), every strategy reproduces `ar` on a tiny
model, and bf16 decoding of the real model runs end to end."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specserve.engine.decode import Engine
from specserve.engine.sampling import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def test_tree_strategies_equal_ar_on_cuda():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config).cuda().eval()
    engine = Engine(model, _Tok(), frozenset(), pad_width=lambda k: max(k, 32))
    prompt = [int(t) for t in torch.randint(0, 96, (30,))] * 3
    params = SamplingParams(max_new_tokens=64)
    ref = engine.generate(prompt, params, "ar")
    for strategy, cfg in (
        ("prompt_lookup", {"draft_len": 8, "max_matches": 4}),
        ("lookahead", {"window": 8, "ngram": 5, "guesses": 8}),
    ):
        assert engine.generate(prompt, params, strategy, cfg).output_ids == ref.output_ids
