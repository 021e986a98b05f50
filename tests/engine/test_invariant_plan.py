"""The invariant layout: which columns each query row's keys [S, t] sit at (S..t in place for a
chain or a decode step, a tree row's ancestors elsewhere), worked examples; both ways of finding
them agree where both apply."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specserve.engine import hf_internals
from specserve.engine.hf_internals import invariant_plan
from specserve.engine.hf_internals.invariant_plan import TAIL


def _chain(past: list[int], q: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """allowed [b, q, columns] and positions [b, q]: batch row r holds past[r] positions and
    verifies a chain of q tokens written at columns past[r].. (column = position)."""
    allowed = torch.zeros(len(past), q, columns, dtype=torch.bool)
    positions = torch.zeros(len(past), q, dtype=torch.long)
    for r, p in enumerate(past):
        for i in range(q):
            allowed[r, i, : p + i + 1] = True
            positions[r, i] = p + i
    return allowed, positions


def _own_columns(layout) -> list[list[int]]:
    """Each query row's tail columns, the padding dropped."""
    columns, counts = layout.tail_columns.tolist(), layout.tail_counts.tolist()
    return [row[:n] for row, n in zip(columns, counts, strict=True)]


def test_a_chain_reads_its_columns_in_place_worked_example():
    allowed, positions = _chain([300], 2, 302)
    layout = hf_internals.invariant_layout(allowed, positions, 3, torch.float32, "cpu")
    assert layout.tail_columns.shape == (2, TAIL) and layout.tail_columns.dtype == torch.int32
    assert layout.tail_counts.tolist() == [45, 46]  # positions 256..300 and 256..301
    assert _own_columns(layout) == [list(range(256, 301)), list(range(256, 302))]
    assert layout.flash_calls == [(0, 1, 256)] and layout.flash_mask == [None]
    assert layout.keyless is None


def test_a_tree_row_reads_its_ancestors_worked_example():
    """Held 40 positions, then a root (column 40, position 40), two siblings (41, 42: position 41)
    and a child of the second sibling (43: position 42)."""
    allowed = torch.zeros(1, 4, 44, dtype=torch.bool)
    allowed[0, :, :40] = True
    for row, seen in enumerate([[40], [40, 41], [40, 42], [40, 42, 43]]):
        allowed[0, row, seen] = True
    positions = torch.tensor([[40, 41, 41, 42]])
    layout = hf_internals.invariant_layout(allowed, positions, 3, torch.float32, "cpu")
    held = list(range(40))  # S = 0 for every row: no flash call, every key in the tail
    assert _own_columns(layout) == [
        [*held, 40],
        [*held, 40, 41],
        [*held, 40, 42],
        [*held, 40, 42, 43],
    ]
    assert layout.flash_calls == []


def test_a_chain_crossing_a_split_point_and_a_short_row():
    allowed, positions = _chain([62, 40], 4, 70)  # row 0's positions 62..65 cross S = 0 -> 32
    layout = hf_internals.invariant_layout(allowed, positions, 3, torch.float32, "cpu")
    own = _own_columns(layout)
    assert [cols[0] for cols in own] == [0, 0, 32, 32, 0, 0, 0, 0]
    assert [cols[-1] for cols in own] == [62, 63, 64, 65, 40, 41, 42, 43]
    assert layout.keyless.shape == (2, 1, 12)  # head-major rows of S = 0: no flash keys
    assert layout.keyless[0, 0].tolist() == [True, True, False, False] * 3


@pytest.mark.parametrize(("past", "q"), [([300], 1), ([300, 95, 33], 5), ([62, 40], 4), ([0], 200)])
def test_in_place_columns_equal_the_gathered_ones(past, q):
    allowed, positions = _chain(past, q, max(past) + q + 7)
    layout = hf_internals.invariant_layout(allowed, positions, 3, torch.bfloat16, "cpu")
    split = invariant_plan.split_point(positions.numpy())
    tail = allowed.numpy() & (np.arange(allowed.shape[2])[None, None, :] >= split[..., None])
    # the tree path's columns for the same rows
    gathered = invariant_plan._gathered(tail, tail.sum(axis=2))
    counts = layout.tail_counts.tolist()
    for row, n in enumerate(counts):
        assert gathered[row, :n].tolist() == layout.tail_columns[row, :n].tolist()
        assert not gathered[row, n:].any()


def test_padded_head_rows_worked_examples():
    """No flash query block of 1-3 rows: G 3, q 1 -> 4; q 11 -> 36 (33: row 32 alone); q 12 ->
    36 as it is; G 1, q 34 -> 36; G 1, q 32 -> 32."""
    assert invariant_plan.padded_head_rows(3, 1) == 4
    assert invariant_plan.padded_head_rows(3, 11) == 36
    assert invariant_plan.padded_head_rows(3, 12) == 36
    assert invariant_plan.padded_head_rows(1, 34) == 36
    assert invariant_plan.padded_head_rows(1, 32) == 32
    rows = np.arange(6).reshape(1, 3, 2)  # [b, G q, width]
    assert invariant_plan.pad_rows(rows, 5).tolist() == [[[0, 1], [2, 3], [4, 5], [0, 1], [0, 1]]]
