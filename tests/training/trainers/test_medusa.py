"""Medusa heads' trainer: out-of-vocabulary targets (not trained, scored as misses), learning on a
tiny model within seconds, the time budget, resume from a checkpoint, own heads, a small draft
vocabulary."""

from __future__ import annotations

import torch

from specserve.engine.drafters.artifact import build_module
from specserve.engine.drafters.specs import MedusaSpec
from specserve.engine.drafters.vocab import head_rows
from specserve.training import examples
from specserve.training.settings import TrainerSettings
from specserve.training.trainers import loop, medusa


def test_out_of_vocabulary_targets_are_not_trained_but_scored_as_misses():
    assert loop.trainable_targets(torch.tensor([3, -1, -100])).tolist() == [3, -100, -100]
    index = examples.vocab_index(torch.tensor([2, 5]), 8)
    feats = [torch.zeros(6, 1, 4)]
    greedy = [torch.tensor([2, 7, 5, 7, 2, 2])]
    rows = examples.medusa_rows([[5, 2, 7, 5, 7, 2]], [1], feats, greedy, heads=1, index=index)
    assert rows.targets[:, 0].tolist() == [-1, 1, -1, 0]  # tokens 7, 5, 7, 2

    class Perfect:  # ranks the right in-vocabulary token first whatever the input
        head = None

        def logits(self, x, rows_w):
            out = torch.zeros(len(x), 1, 2)
            out[:, 0, 0] = torch.tensor([0.0, 0.0, 0.0, 1.0])[: len(x)]
            out[:, 0, 1] = torch.tensor([0.0, 1.0, 0.0, 0.0])[: len(x)]
            return out

    acc = medusa.medusa_accept_rates(Perfect(), torch.zeros(2, 4), rows, topk=1)
    assert acc == [[0.5]]  # both in-vocabulary tokens hit, both others missed
    loss = medusa.medusa_loss(Perfect(), torch.zeros(2, 4), rows.features, rows.targets, 1.0)
    logits = Perfect().logits(rows.features, None)[:, 0]  # only the in-vocabulary rows count
    in_vocab = torch.nn.functional.cross_entropy(logits[[1, 3]], torch.tensor([1, 0]))
    assert torch.equal(loss, in_vocab)


def test_medusa_training_learns_and_resumes(tiny_llama, tmp_path, teacher, loopy_data):
    model = tiny_llama(1, init_range=0.1)
    seqs = loopy_data(model)
    plens = [4] * len(seqs)
    feats, greedy = teacher(model, seqs, (-1,))
    vocab = torch.arange(96)
    index = examples.vocab_index(vocab, 96)
    rows = examples.medusa_rows(seqs, plens, feats, greedy, 2, index)
    heads = build_module(model, MedusaSpec(heads=2, topk=4))
    w = head_rows(model, vocab)
    before = medusa.medusa_accept_rates(heads, w, rows, 1)
    settings = TrainerSettings(lr=3e-3, warmup_steps=2, checkpoint_seconds=0.5)
    ckpt = tmp_path / "ckpt.pt"
    state = medusa.train_medusa(heads, w, rows, settings, budget_s=2.0, ckpt=ckpt)
    after = medusa.medusa_accept_rates(heads, w, rows, 1)
    assert state["step"] > 5 and ckpt.exists()
    assert after[1][0] > before[1][0] + 0.1, (before, after)
    # resume: a new loop continues the step count and stops once the (larger) budget is spent
    heads2 = build_module(model, MedusaSpec(heads=2, topk=4))
    state2 = medusa.train_medusa(heads2, w, rows, settings, budget_s=3.0, ckpt=ckpt)
    assert state2["step"] > state["step"]
    assert 3.0 <= state2["elapsed"] < 4.5


def test_medusa_own_heads_start_as_the_shared_head_and_learn(tiny_llama, teacher, loopy_data):
    model = tiny_llama(1, init_range=0.1)
    seqs = loopy_data(model, n=12)
    feats, greedy = teacher(model, seqs, (-1,))
    vocab = torch.arange(96)
    index = examples.vocab_index(vocab, 96)
    rows = examples.medusa_rows(seqs, [4] * len(seqs), feats, greedy, 2, index)
    w = head_rows(model, vocab)
    shared = build_module(model, MedusaSpec(heads=2, topk=4))
    own = build_module(model, MedusaSpec(heads=2, topk=4, own_head=96))
    settings = TrainerSettings(lr=3e-3, warmup_steps=2)
    medusa.train_medusa(own, w, rows, settings, budget_s=0.0)  # initializes, no step
    x = rows.features[:5]
    assert torch.allclose(own.logits(x, w), shared.logits(x, w), atol=1e-5)
    before = medusa.medusa_accept_rates(own, w, rows, 1)
    medusa.train_medusa(own, w, rows, settings, budget_s=2.0)
    after = medusa.medusa_accept_rates(own, w, rows, 1)
    assert after[1][0] > before[1][0] + 0.1, (before, after)


def test_accept_rates_with_a_draft_vocabulary_smaller_than_topk(tiny_llama, teacher, loopy_data):
    """A variant whose answers use few distinct tokens: rates stop at the vocabulary's size."""
    model = tiny_llama(1, init_range=0.1)
    seqs = loopy_data(model, n=4, length=12)
    feats, greedy = teacher(model, seqs, (-1,))
    vocab = torch.tensor(sorted({t for s in seqs for t in s})[:3])  # 3 tokens < topk 5
    index = examples.vocab_index(vocab, 96)
    rows = examples.medusa_rows(seqs, [4] * len(seqs), feats, greedy, 2, index)
    heads = build_module(model, MedusaSpec(heads=2, topk=5))
    rates = medusa.medusa_accept_rates(heads, head_rows(model, vocab), rows, 5)
    assert len(rates) == 2 and all(len(r) == 3 for r in rates)
    assert all(0.0 <= x <= 1.0 for r in rates for x in r)
