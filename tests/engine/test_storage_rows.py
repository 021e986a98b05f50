"""`hf_internals.storage_rows`: entries of a cache tensor gathered through its storage rows, equal
to plain indexing for contiguous tensors, views with spare capacity and odd strides."""

from __future__ import annotations

import pytest
import torch

from specserve.engine.hf_internals.storage_rows import (
    entry_index,
    gather_entries,
    row_strided,
    rows_of,
)


def _reference(states, batch, columns):
    """The slow reference: one (row, column) at a time."""
    return torch.stack(
        [
            torch.stack([states[b, :, c] for c in cols], dim=1)
            for b, cols in zip(batch.tolist(), columns.tolist(), strict=True)
        ]
    )


def test_docstring_example():
    states = torch.arange(3 * 2 * 4 * 2, dtype=torch.float32).view(3, 2, 4, 2)
    got = gather_entries(states, torch.tensor([2, 0]), torch.tensor([[0, 3], [1, 1]]))
    assert got.shape == (2, 2, 2, 2)
    assert torch.equal(got[0, :, 0], states[2, :, 0]) and torch.equal(got[0, :, 1], states[2, :, 3])
    assert torch.equal(got[1, :, 0], states[0, :, 1]) and torch.equal(got[1, :, 1], states[0, :, 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_view_with_spare_capacity_reads_only_its_entries(dtype):
    """A growing layer's used part [b, h, used, d] of a [b, h, capacity, d] buffer: read in place
    (no copy), and the gathered entries equal the reference."""
    torch.manual_seed(0)
    buffer = torch.randn(4, 3, 50, 8).to(dtype)
    used = buffer[:, :, :20]
    assert row_strided(used) is used
    batch = torch.tensor([3, 1, 1, 0])
    columns = torch.randint(0, 20, (4, 7))
    assert torch.equal(gather_entries(used, batch, columns), _reference(used, batch, columns))
    assert rows_of(used).data_ptr() == buffer.data_ptr()


def test_a_tensor_whose_rows_are_not_contiguous_is_copied_first():
    """[b, h, columns, d] transposed from [b, columns, h, d] (column stride h d) and one whose
    last dim is not contiguous are copied before the gather; the result is the reference's."""
    torch.manual_seed(1)
    states = torch.randn(2, 5, 3, 4).transpose(1, 2)  # [2, 3, 5, 4]: column stride 12, not d
    assert row_strided(states) is not states
    odd = torch.randn(2, 3, 4, 5).transpose(2, 3)  # last dim not contiguous
    assert row_strided(odd) is not odd
    batch, columns = torch.tensor([1, 0]), torch.tensor([[4, 0, 2], [1, 1, 3]])
    for t in (states, odd):
        assert torch.equal(gather_entries(t, batch, columns), _reference(t, batch, columns))


def test_entry_index_docstring_example():
    states = torch.zeros(2, 2, 4, 3)  # strides (24, 12, 3, 1): rows of d = 3, 8 a batch row
    assert entry_index(states, torch.tensor([1]), torch.tensor([[2, 0]])).tolist() == [
        10,
        8,
        14,
        12,
    ]
