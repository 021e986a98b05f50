"""The invariant layout: chains and decode steps read their tails in place (`TailWindows`), trees
gather them, and both give the same bits for the same rows; worked examples of the windows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from specserve.engine import hf_internals
from specserve.engine.hf_internals import invariant, invariant_plan
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


def _as_gathered(layout, allowed, positions):
    """The same layout with its tails gathered per row (the tree path) instead of windows."""
    split = invariant_plan.split_point(positions.numpy())
    tail = allowed.numpy() & (np.arange(allowed.shape[2])[None, None, :] >= split[..., None])
    parts = invariant_plan._gathered(tail, tail.sum(axis=2), 3, torch.float32, "cpu")
    return dataclasses.replace(layout, windows=None, **parts)


def test_windows_worked_example():
    allowed, positions = _chain([300], 2, 302)
    layout = hf_internals.invariant_layout(allowed, positions, 3, torch.float32, "cpu")
    windows = layout.windows
    assert (windows.batch, windows.start, windows.entry) == ([0], [256], None)
    kept = (windows.mask[0, 0] == 0).sum(dim=1).tolist()  # per head-major row: G = 3 x 2 rows
    assert kept == [45, 46] * 3
    assert layout.flash_mask == [None]  # every row keeps all 256 columns: no mask at all


def test_a_tree_is_gathered_and_a_chain_crossing_a_block_has_two_entries():
    allowed, positions = _chain([62, 40], 4, 70)  # row 0 spans split points 0 and 32
    layout = hf_internals.invariant_layout(allowed, positions, 3, torch.float32, "cpu")
    assert (layout.windows.batch, layout.windows.start) == ([0, 0, 1], [0, 32, 0])
    assert layout.windows.entry[:, 0, 0, :, 0].tolist() == [[0, 0, 1, 1], [2, 2, 2, 2]]
    allowed[0, 3, 64] = False  # the last row skips its parent: a tree branch
    layout = hf_internals.invariant_layout(allowed, positions, 3, torch.float32, "cpu")
    assert layout.windows is None and layout.tail_columns is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("past", "q"), [([300], 1), ([300, 95, 33], 5), ([62, 40], 4)])
def test_rows_read_in_place_equal_the_same_rows_gathered(dtype, past, q):
    gen = torch.Generator().manual_seed(len(past) * 10 + q)
    columns = max(past) + q + 7  # spare columns past every row: the windows view reaches them
    allowed, positions = _chain(past, q, columns)
    keys = torch.randn(len(past), 2, columns, 32, generator=gen).to(dtype)
    values = torch.randn(len(past), 2, columns, 32, generator=gen).to(dtype)
    query = torch.randn(len(past), 6, q, 32, generator=gen).to(dtype)
    layout = hf_internals.invariant_layout(allowed, positions, 3, dtype, "cpu")
    assert layout.windows is not None
    in_place = invariant.invariant_attention(None, query, keys, values, layout, 0.2)
    gathered = _as_gathered(layout, allowed, positions)
    assert torch.equal(
        in_place, invariant.invariant_attention(None, query, keys, values, gathered, 0.2)
    )


def test_tail_windows_copy_where_a_view_would_leave_the_storage():
    states = torch.arange(2 * 1 * 80 * 2, dtype=torch.float32).reshape(2, 1, 80, 2)
    windows = invariant_plan.TailWindows(batch=[0, 1], start=[0, 32], mask=None, entry=None)
    view = invariant.tail_windows(states, windows)  # row 1 from 32 runs past the storage's end
    assert view.shape == (2, 1, TAIL, 2)
    assert torch.equal(view[0], states[0, :, :TAIL])
    assert torch.equal(view[1, :, :48], states[1, :, 32:80])
    assert not view[1, :, 48:].any()  # zero-padded on the right
    inside = invariant_plan.TailWindows(batch=[0], start=[16], mask=None, entry=None)
    window = invariant.tail_windows(states, inside)  # row 0 from 16: inside, a view
    assert window.untyped_storage().data_ptr() == states.untyped_storage().data_ptr()
    assert torch.equal(window[0], states[0, :, 16 : 16 + TAIL])
