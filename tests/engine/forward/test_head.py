"""The float32 LM head over a bf16 model: exact float32 arithmetic, still a lossless engine."""

from __future__ import annotations

import copy

import torch

from specserve.engine.decode.engine import Engine
from specserve.engine.forward.head import Float32Head, use_float32_head
from specserve.engine.sampling import SamplingParams


def test_float32_head_matches_a_float64_reference():
    head = torch.nn.Linear(8, 5, bias=True).to(torch.bfloat16)
    x = torch.randn(3, 8).to(torch.bfloat16)
    got = Float32Head(head)(x)
    ref = x.double() @ head.weight.double().T + head.bias.double()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)


def test_use_float32_head_on_a_bf16_model_only(tiny_llama, tokenizer):
    fp32 = copy.deepcopy(tiny_llama(1, init_range=0.1))
    assert use_float32_head(fp32) is False
    model = fp32.to(torch.bfloat16)
    assert use_float32_head(model) is True and use_float32_head(model) is False
    out = model(input_ids=torch.tensor([[3, 4, 5]]))
    assert out.logits.dtype == torch.float32
    engine = Engine(model, tokenizer, frozenset())
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4]
    ar = engine.generate(prompt, SamplingParams(max_new_tokens=16), "ar").output_ids
    assert len(ar) == 16
