from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from specserve.engine.sampling import SamplingParams, target_probs


def ref_target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Loop-based: temperature, then keep the top-k scores, then the smallest most-likely prefix
    whose probability mass reaches top_p, then renormalize."""
    out = torch.zeros(logits.shape, dtype=torch.float64)
    t = max(params.temperature, 1e-6)
    for r, row in enumerate(logits.tolist()):
        scores = [x / t for x in row]
        keep = set(range(len(scores)))
        if params.top_k and params.top_k < len(scores):
            kth = sorted(scores, reverse=True)[params.top_k - 1]
            keep = {i for i in keep if scores[i] >= kth}
        if params.top_p < 1.0:
            m = max(scores[i] for i in keep)
            z = sum(math.exp(scores[i] - m) for i in keep)
            order = sorted(keep, key=lambda i: -scores[i])
            kept, mass = set(), 0.0
            for i in order:
                if mass >= params.top_p:
                    break
                kept.add(i)
                mass += math.exp(scores[i] - m) / z
            keep = kept
        m = max(scores[i] for i in keep)
        z = sum(math.exp(scores[i] - m) for i in keep)
        for i in keep:
            out[r, i] = math.exp(scores[i] - m) / z
    return out


def test_docstring_example():
    logits = torch.tensor([[2.0, 1.0, 0.0, -9.0]])
    e = math.e
    expected = torch.tensor([[e / (e + 1), 1 / (e + 1), 0.0, 0.0]])
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, expected, atol=1e-6)
    assert abs(p[0, 0].item() - 0.731) < 1e-3 and abs(p[0, 1].item() - 0.269) < 1e-3
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.allclose(p, expected, atol=1e-6)
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.6))
    assert torch.allclose(p, torch.tensor([[1.0, 0.0, 0.0, 0.0]]), atol=1e-6)


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 1.8])
@pytest.mark.parametrize("top_k", [0, 1, 3, 10, 40])
@pytest.mark.parametrize("top_p", [1.0, 0.95, 0.5, 0.05])
def test_matches_loop_reference(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(int(temperature * 100) + top_k + int(top_p * 1000))
    logits = torch.randn(5, 40, generator=g) * 3
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    got = target_probs(logits, params)
    assert got.shape == logits.shape and got.dtype == torch.float32
    ref = ref_target_probs(logits, params)
    assert torch.allclose(got.double(), ref, atol=1e-5)
    assert torch.equal(got > 0, ref > 0)  # the same support exactly
    assert torch.allclose(got.sum(-1), torch.ones(5), atol=1e-5)


def test_temperature_zero_is_argmax_point_mass():
    logits = torch.tensor([[0.1, 3.0, 2.5, -1.0], [5.0, 4.0, 0.0, 0.0]])
    p = target_probs(logits, SamplingParams())
    assert torch.equal(p, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))


def test_top_k_keeps_ties_and_ignores_k_at_least_vocab():
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.0]])
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=1))
    assert torch.allclose(p, torch.tensor([[0.0, 0.5, 0.5, 0.0]]))
    full = target_probs(logits, SamplingParams(temperature=1.0))
    assert torch.allclose(target_probs(logits, SamplingParams(temperature=1.0, top_k=4)), full)
    assert torch.allclose(target_probs(logits, SamplingParams(temperature=1.0, top_k=99)), full)


def test_defaults():
    p = SamplingParams()
    assert p.greedy and p.max_new_tokens == 128 and p.top_p == 1.0 and p.top_k == 0
    assert p.stop == [] and p.seed is None and not p.ignore_eos
    assert not SamplingParams(temperature=0.5).greedy


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -3}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"bogus_field": 1}, "bogus_field"),
    ],
)
def test_validation_names_the_field(kwargs, field):
    with pytest.raises(ValidationError) as info:
        SamplingParams(**kwargs)
    assert field in str(info.value)
    assert [e["loc"][0] for e in info.value.errors()] == [field]


def test_model_validate_dict():
    p = SamplingParams.model_validate({"temperature": 0.8, "top_p": 0.9, "stop": ["\n"]})
    assert p.temperature == 0.8 and p.stop == ["\n"]
