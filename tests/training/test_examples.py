"""Training examples: the unrolled (EAGLE-3 style) attention pattern against a slow reference, the
draft-vocabulary index, Medusa rows and the EAGLE batch layout."""

from __future__ import annotations

import torch

from specserve.training import examples


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


def test_eagle_batch_layout():
    index = examples.vocab_index(torch.arange(10), 10)
    f = torch.arange(4.0)[:, None, None].expand(4, 2, 2).clone()
    greedy = [torch.tensor([2, 3, 4, 9]), torch.tensor([6, 9])]
    batch = examples.eagle_batch([[1, 2, 3, 4], [5, 6]], [1, 1], [f, f[:2]], greedy, index)
    assert batch.next_tokens.tolist() == [[2, 3, 4], [6, 0, 0]]
    assert batch.next_final[0, :, 0].tolist() == [1.0, 2.0, 3.0]
    assert batch.targets.tolist() == [[3, 4, -100], [-100, -100, -100]]
    assert batch.valid.tolist() == [[True, True, True], [True, False, False]]
