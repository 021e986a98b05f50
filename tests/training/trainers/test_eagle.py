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


def _eagle_loss_reference(outs, batch, rows_w, settings):
    """Pass by pass, the teacher's logits recomputed over each pass's own scored rows."""
    total = torch.zeros((), dtype=torch.float64)
    for j, h in enumerate(outs):
        valid = batch.valid.clone()
        valid[:, :j] = False
        tgt = batch.targets.masked_fill(batch.targets < 0, examples.IGNORE)
        tgt[:, :j] = examples.IGNORE
        scored = tgt != examples.IGNORE
        reg = torch.nn.functional.smooth_l1_loss(h[valid], batch.next_final[valid])
        teacher = batch.next_final[scored] @ rows_w.T
        ce = eagle.soft_cross_entropy(h[scored] @ rows_w.T, teacher)
        total = total + settings.reg_weight * reg + settings.ce_weight * ce
    return total


def test_eagle_loss_shares_the_teacher_logits_across_passes():
    """One teacher product for every pass gives the pass-by-pass loss (out-of-vocabulary and
    padding rows included), in float64."""
    torch.manual_seed(0)
    b, n, hidden, v = 2, 6, 5, 7
    targets = torch.randint(0, v, (b, n))
    targets[0, 1], targets[1, 4:] = examples.OUT_OF_VOCAB, examples.IGNORE
    valid = torch.ones(b, n, dtype=torch.bool)
    valid[1, 5] = False
    batch = examples.EagleBatch(
        torch.randn(b, n, 1, hidden, dtype=torch.float64),
        torch.randint(0, v, (b, n)),
        torch.randn(b, n, hidden, dtype=torch.float64),
        targets,
        valid,
    )
    outs = [torch.randn(b, n, hidden, dtype=torch.float64) for _ in range(3)]
    rows_w = torch.randn(v, hidden, dtype=torch.float64)
    settings = TrainerSettings(reg_weight=0.5, ce_weight=1.0, soft_labels=True)
    got = eagle.eagle_loss(outs, batch, rows_w, settings)
    want = _eagle_loss_reference(outs, batch, rows_w, settings)
    assert torch.allclose(got, want, rtol=1e-12), (got, want)
