"""The EAGLE layer's trainer: soft cross-entropy against a slow reference and its hard limit, and
learning on a tiny model within seconds (hard and soft labels, fp32 and bf16 autocast)."""

from __future__ import annotations

import math

import pytest
import torch

from specserve.engine.drafters.artifact import build_module
from specserve.engine.drafters.specs import EagleSpec
from specserve.engine.drafters.vocab import head_rows
from specserve.training import examples
from specserve.training.settings import TrainerSettings
from specserve.training.trainers import eagle


def _soft_ce_reference(logits, teacher):
    total = 0.0
    for row, t in zip(logits.tolist(), teacher.tolist()):
        z_t = math.log(sum(math.exp(x) for x in t))
        z = math.log(sum(math.exp(x) for x in row))
        total -= sum(math.exp(tv - z_t) * (x - z) for x, tv in zip(row, t))
    return total / len(logits)


def test_soft_cross_entropy_matches_reference_and_hard_limit():
    torch.manual_seed(0)
    logits, teacher = torch.randn(5, 7, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    even = eagle.soft_cross_entropy(torch.zeros(1, 2), torch.zeros(1, 2)).item()
    assert math.isclose(even, math.log(2), rel_tol=1e-6)
    got = eagle.soft_cross_entropy(logits, teacher).item()
    assert math.isclose(got, _soft_ce_reference(logits, teacher), rel_tol=1e-9)
    one_hot = torch.full((5, 7), -1e4, dtype=torch.float64)
    one_hot[torch.arange(5), torch.tensor([0, 3, 6, 2, 2])] = 0.0
    hard = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 3, 6, 2, 2]))
    assert math.isclose(eagle.soft_cross_entropy(logits, one_hot).item(), hard.item())


@pytest.mark.parametrize(("soft", "autocast"), [(False, "off"), (True, "off"), (True, "bfloat16")])
def test_eagle_training_learns(tiny_llama, soft, autocast, teacher, loopy_data):
    model = tiny_llama(1, init_range=0.1)
    seqs = loopy_data(model)
    plens = [4] * len(seqs)
    feats, greedy = teacher(model, seqs, (-1, -1))
    vocab = torch.arange(96)
    index = examples.vocab_index(vocab, 96)
    batches = [
        examples.eagle_batch(
            seqs[i : i + 4], plens[i : i + 4], feats[i : i + 4], greedy[i : i + 4], index
        )
        for i in range(0, len(seqs), 4)
    ]
    draft = build_module(model, EagleSpec())
    w = head_rows(model, vocab)
    before = eagle.eagle_accept_rates(draft, model, w, batches, depth=2, topk=1)
    settings = TrainerSettings(
        lr=3e-3, warmup_steps=2, ce_weight=1.0, soft_labels=soft, autocast=autocast
    )
    state = eagle.train_eagle(draft, model, w, batches, settings, budget_s=4.0)
    assert all(p.dtype == torch.float32 for p in draft.parameters())  # fp32 master weights
    after = eagle.eagle_accept_rates(draft, model, w, batches, depth=2, topk=1)
    assert state["step"] > 5
    assert after[0][0] > before[0][0] + 0.2, (before, after)
    assert after[1][0] > before[1][0] + 0.1, (before, after)
