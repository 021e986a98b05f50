"""Training tensors (slow references), trainers that learn on a tiny model within seconds, the
time budget, resume from a checkpoint, and the unrolled (EAGLE-3 style) attention pattern."""

from __future__ import annotations

import math

import pytest
import torch

from specserve.engine.drafters.artifact import build_module
from specserve.engine.drafters.specs import EagleSpec, MedusaSpec
from specserve.engine.drafters.vocab import head_rows
from specserve.training import examples, trainers
from specserve.training.features import prefill


def teacher(model, seqs, layers):
    """(features, greedy) per sequence, from one prefill."""
    out = prefill(model, seqs, layers)
    return [f.float() for f, _ in out], [g for _, g in out]


def _ttt_reference(n: int, step: int) -> torch.Tensor:
    """Row t of pass `step` is a depth step - 1 draft node whose chain started at committed
    position c = t - step + 1: it sees committed rows 0..c and the chain rows c+1..t of passes
    2..step (pass i holds the node at position c + i - 1)."""
    allowed = torch.zeros(n, n * step, dtype=torch.bool)
    for t in range(n):
        c = t - step + 1
        for s in range(n):
            if s <= c or (step == 1 and s <= t):
                allowed[t, s] = True
        for i in range(2, step + 1):
            pos = c + i - 1
            if 0 <= pos < n:
                allowed[t, (i - 1) * n + pos] = True
        if not allowed[t].any():
            allowed[t, (step - 1) * n + t] = True
    return allowed


def test_ttt_allowed_matches_reference():
    for n in (1, 3, 6):
        for step in (1, 2, 3, 4):
            assert torch.equal(examples.ttt_allowed(n, step), _ttt_reference(n, step)), (n, step)


def test_vocab_index_and_medusa_rows_examples():
    index = examples.vocab_index(torch.tensor([2, 5]), 6)
    assert index.tolist() == [-1, -1, 0, -1, -1, 1]
    ids = [5, 2, 5, 5, 2]
    feats = [torch.arange(5.0)[:, None, None].expand(5, 1, 3)]
    greedy = [torch.tensor([2, 5, 5, 2, 5])]  # the target's argmax after each position
    rows = examples.medusa_rows([ids], [2], feats, greedy, heads=2, index=index)
    assert rows.features[:, 0].tolist() == [1.0, 2.0]
    assert rows.targets.tolist() == [[1, 0], [0, 1]]


def test_out_of_vocabulary_targets_are_not_trained_but_scored_as_misses():
    assert trainers.trainable_targets(torch.tensor([3, -1, -100])).tolist() == [3, -100, -100]
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

    acc = trainers.medusa_accept_rates(Perfect(), torch.zeros(2, 4), rows, topk=1)
    assert acc == [[0.5]]  # both in-vocabulary tokens hit, both others missed
    loss = trainers.medusa_loss(Perfect(), torch.zeros(2, 4), rows.features, rows.targets, 1.0)
    logits = Perfect().logits(rows.features, None)[:, 0]  # only the in-vocabulary rows count
    in_vocab = torch.nn.functional.cross_entropy(logits[[1, 3]], torch.tensor([1, 0]))
    assert torch.equal(loss, in_vocab)


def test_eagle_batch_layout():
    index = examples.vocab_index(torch.arange(10), 10)
    f = torch.arange(4.0)[:, None, None].expand(4, 2, 2).clone()
    greedy = [torch.tensor([2, 3, 4, 9]), torch.tensor([6, 9])]
    batch = examples.eagle_batch([[1, 2, 3, 4], [5, 6]], [1, 1], [f, f[:2]], greedy, index)
    assert batch.next_tokens.tolist() == [[2, 3, 4], [6, 0, 0]]
    assert batch.next_final[0, :, 0].tolist() == [1.0, 2.0, 3.0]
    assert batch.targets.tolist() == [[3, 4, -100], [-100, -100, -100]]
    assert batch.valid.tolist() == [[True, True, True], [True, False, False]]


def _loopy_data(model, n=24, length=40):
    """Sequences the tiny model generated itself (greedy), as self-distillation data."""
    g = torch.Generator().manual_seed(0)
    seqs = []
    with torch.inference_mode():
        for i in range(n):
            prompt = torch.randint(0, 96, (1, 4), generator=g)
            out = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=length,
                do_sample=False,
                pad_token_id=0,
            )
            seqs.append(out[0].tolist())
    return seqs


def test_medusa_training_learns_and_resumes(tiny_llama, tmp_path):
    model = tiny_llama(1, init_range=0.1)
    seqs = _loopy_data(model)
    plens = [4] * len(seqs)
    feats, greedy = teacher(model, seqs, (-1,))
    vocab = torch.arange(96)
    index = examples.vocab_index(vocab, 96)
    rows = examples.medusa_rows(seqs, plens, feats, greedy, 2, index)
    heads = build_module(model, MedusaSpec(heads=2, topk=4))
    w = head_rows(model, vocab)
    before = trainers.medusa_accept_rates(heads, w, rows, 1)
    settings = trainers.TrainerSettings(lr=3e-3, warmup_steps=2, checkpoint_seconds=0.5)
    ckpt = tmp_path / "ckpt.pt"
    state = trainers.train_medusa(heads, w, rows, settings, budget_s=2.0, ckpt=ckpt)
    after = trainers.medusa_accept_rates(heads, w, rows, 1)
    assert state["step"] > 5 and ckpt.exists()
    assert after[1][0] > before[1][0] + 0.1, (before, after)
    # resume: a new loop continues the step count and stops once the (larger) budget is spent
    heads2 = build_module(model, MedusaSpec(heads=2, topk=4))
    state2 = trainers.train_medusa(heads2, w, rows, settings, budget_s=3.0, ckpt=ckpt)
    assert state2["step"] > state["step"]
    assert 3.0 <= state2["elapsed"] < 4.5


def test_medusa_own_heads_start_as_the_shared_head_and_learn(tiny_llama):
    model = tiny_llama(1, init_range=0.1)
    seqs = _loopy_data(model, n=12)
    feats, greedy = teacher(model, seqs, (-1,))
    vocab = torch.arange(96)
    index = examples.vocab_index(vocab, 96)
    rows = examples.medusa_rows(seqs, [4] * len(seqs), feats, greedy, 2, index)
    w = head_rows(model, vocab)
    shared = build_module(model, MedusaSpec(heads=2, topk=4))
    own = build_module(model, MedusaSpec(heads=2, topk=4, own_head=96))
    settings = trainers.TrainerSettings(lr=3e-3, warmup_steps=2)
    trainers.train_medusa(own, w, rows, settings, budget_s=0.0)  # initializes, no step
    x = rows.features[:5]
    assert torch.allclose(own.logits(x, w), shared.logits(x, w), atol=1e-5)
    before = trainers.medusa_accept_rates(own, w, rows, 1)
    trainers.train_medusa(own, w, rows, settings, budget_s=2.0)
    after = trainers.medusa_accept_rates(own, w, rows, 1)
    assert after[1][0] > before[1][0] + 0.1, (before, after)


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
    even = trainers.soft_cross_entropy(torch.zeros(1, 2), torch.zeros(1, 2)).item()
    assert math.isclose(even, math.log(2), rel_tol=1e-6)
    got = trainers.soft_cross_entropy(logits, teacher).item()
    assert math.isclose(got, _soft_ce_reference(logits, teacher), rel_tol=1e-9)
    one_hot = torch.full((5, 7), -1e4, dtype=torch.float64)
    one_hot[torch.arange(5), torch.tensor([0, 3, 6, 2, 2])] = 0.0
    hard = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 3, 6, 2, 2]))
    assert math.isclose(trainers.soft_cross_entropy(logits, one_hot).item(), hard.item())


@pytest.mark.parametrize(("soft", "autocast"), [(False, "off"), (True, "off"), (True, "bfloat16")])
def test_eagle_training_learns(tiny_llama, soft, autocast):
    model = tiny_llama(1, init_range=0.1)
    seqs = _loopy_data(model)
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
    before = trainers.eagle_accept_rates(draft, model, w, batches, depth=2, topk=1)
    settings = trainers.TrainerSettings(
        lr=3e-3, warmup_steps=2, ce_weight=1.0, soft_labels=soft, autocast=autocast
    )
    state = trainers.train_eagle(draft, model, w, batches, settings, budget_s=4.0)
    assert all(p.dtype == torch.float32 for p in draft.parameters())  # fp32 master weights
    after = trainers.eagle_accept_rates(draft, model, w, batches, depth=2, topk=1)
    assert state["step"] > 5
    assert after[0][0] > before[0][0] + 0.2, (before, after)
    assert after[1][0] > before[1][0] + 0.1, (before, after)


def test_loop_keeps_the_best_heldout_epoch(tmp_path):
    """Held-out loss rises after the second epoch: the module ends in its epoch-2 state."""
    torch.manual_seed(0)
    module = torch.nn.Linear(2, 1)
    x, y = torch.randn(16, 2), torch.randn(16, 1)
    seen: list[torch.Tensor] = []
    scores = iter([3.0, 1.0, 2.0, 5.0, 6.0, 7.0, 8.0, 9.0] + [10.0] * 1000)

    def heldout():
        seen.append(module.weight.detach().clone())
        return next(scores)

    settings = trainers.TrainerSettings(lr=1e-2, warmup_steps=0)
    loop = trainers.Loop(module, settings, budget_s=0.3, ckpt=tmp_path / "c.pt")
    state = loop.run(
        lambda epoch: [0, 1], lambda i: ((module(x) - y) ** 2).mean(), heldout_loss=heldout
    )
    assert state["best_epoch"] == 2 and state["heldout_losses"][:3] == [3.0, 1.0, 2.0]
    assert len(seen) > 3
    assert torch.equal(module.weight, seen[1])
    resumed = trainers.Loop(torch.nn.Linear(2, 1), settings, budget_s=0.3, ckpt=tmp_path / "c.pt")
    assert resumed.state["best_epoch"] == 2 and resumed.best is not None


def test_lr_schedule_example():
    s = trainers.TrainerSettings(lr=1e-3, warmup_steps=0)
    assert trainers._lr(s, 100, 0.5) == pytest_approx(5.5e-4)


def pytest_approx(x):
    import pytest

    return pytest.approx(x)


def test_accept_rates_with_a_draft_vocabulary_smaller_than_topk(tiny_llama):
    """A variant whose answers use few distinct tokens: rates stop at the vocabulary's size."""
    model = tiny_llama(1, init_range=0.1)
    seqs = _loopy_data(model, n=4, length=12)
    feats, greedy = teacher(model, seqs, (-1,))
    vocab = torch.tensor(sorted({t for s in seqs for t in s})[:3])  # 3 tokens < topk 5
    index = examples.vocab_index(vocab, 96)
    rows = examples.medusa_rows(seqs, [4] * len(seqs), feats, greedy, 2, index)
    heads = build_module(model, MedusaSpec(heads=2, topk=5))
    rates = trainers.medusa_accept_rates(heads, head_rows(model, vocab), rows, 5)
    assert len(rates) == 2 and all(len(r) == 3 for r in rates)
    assert all(0.0 <= x <= 1.0 for r in rates for x in r)
