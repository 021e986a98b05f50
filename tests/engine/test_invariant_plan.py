"""The invariant layout: chains and decode steps read their tails in place (`TailWindows`), trees
gather them, and both give the same bits for the same rows; worked examples of the windows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from specserve.engine import hf_internals
from specserve.engine.forward import invariance
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
    assert (windows.batch, windows.start, windows.source, windows.back) == ([0], [256], None, None)
    kept = (windows.mask[0, 0] == 0).sum(dim=1).tolist()  # per head-major row: G = 3 x 2 rows
    assert kept == [45, 46] * 3
    assert layout.flash_mask == [None]  # every row keeps all 256 columns: no mask at all


def test_a_tree_is_gathered_and_a_chain_crossing_a_block_has_two_entries():
    allowed, positions = _chain([62, 40], 4, 70)  # row 0 spans split points 0 and 32
    layout = hf_internals.invariant_layout(allowed, positions, 3, torch.float32, "cpu")
    assert (layout.windows.batch, layout.windows.start) == ([0, 0, 1], [0, 32, 0])
    # entries: row 0's positions 62, 63 (S 0) and 64, 65 (S 32), row 1's four (S 0); at most 4
    # members, so 12 head rows an entry: query row (r, g = 0, i) reads entry row e 12 + j
    assert layout.windows.back.view(2, 3, 4)[:, 0].tolist() == [[0, 1, 12, 13], [24, 25, 26, 27]]
    assert layout.windows.mask.shape == (3, 1, 12, TAIL)
    allowed[0, 3, 64] = False  # the last row skips its parent: a tree branch
    layout = hf_internals.invariant_layout(allowed, positions, 3, torch.float32, "cpu")
    assert layout.windows is None and layout.tail_columns is not None


# float32's flash kernel is not row-invariant past ~100 query rows here (a few rows of a 200-row
# prompt differ by 2e-8 between the two paths, as before windows): float32 never serves the
# invariant forward (`invariance.probe`), so its long prompt is checked in bfloat16 only
CASES = [([300], 1), ([300, 95, 33], 5), ([62, 40], 4), ([96, 7], 70)]


@pytest.mark.parametrize(
    ("dtype", "past", "q"),
    [(torch.float32, *case) for case in CASES]
    + [(torch.bfloat16, *case) for case in [*CASES, ([0], 200)]],
)
def test_rows_read_in_place_equal_the_same_rows_gathered(dtype, past, q):
    if not invariance.attention_invariant(9, 3, 64, dtype):  # the bitwise claim's premise
        pytest.skip(f"{dtype} flash attention is not invariant to layout on this machine")
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


def test_tail_windows_gather_where_a_view_would_leave_the_storage():
    states = torch.arange(2 * 1 * 80 * 2, dtype=torch.float32).reshape(2, 1, 80, 2)
    windows = invariant_plan.TailWindows(
        batch=[0, 1], start=[0, 32], mask=None, source=None, back=None
    )
    got = invariant.tail_windows(states, windows)  # row 1 from 32 runs past the storage's end
    assert got.shape == (2, 1, TAIL, 2)
    assert torch.equal(got[0], states[0, :, :TAIL])
    assert torch.equal(got[1, :, :48], states[1, :, 32:80])
    assert torch.equal(got[1, :, 48:], states[1, :, 79:80].expand(-1, 16, -1))  # the last again
    uneven = invariant_plan.TailWindows(
        batch=[0, 1], start=[0, 8], mask=None, source=None, back=None
    )
    got = invariant.tail_windows(states, uneven)  # offsets 0 and 160 + 16: no one stride
    assert torch.equal(got[1], states[1, :, 8 : 8 + TAIL])
    inside = invariant_plan.TailWindows(batch=[0], start=[16], mask=None, source=None, back=None)
    window = invariant.tail_windows(states, inside)  # row 0 from 16: inside, a view
    assert window.untyped_storage().data_ptr() == states.untyped_storage().data_ptr()
    assert torch.equal(window[0], states[0, :, 16 : 16 + TAIL])
