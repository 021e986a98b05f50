"""The plan (layout) of a position-invariant forward (`invariant`), built once per forward: each query
row's split point S(t), the flash calls over keys [0, S) and where its keys [S, t] sit (in place:
`TailWindows`; or gathered per row, e.g. a tree's branches)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

BLOCK = 32  # split points are multiples of this (the flash kernel's masked tail is invariant there)
DEPTH = 32  # a query may sit at most this far past the positions its row held before the forward
TAIL = BLOCK + DEPTH  # keys [S, t] per query row
CALL_COST = 800  # a flash call's fixed cost in query-row x key-column products (~11 us, AMX Xeon)


class DraftTooDeep(ValueError):
    """A query row sits further past its row's held positions than `DEPTH`."""


def split_point(positions):
    """S(t) per query position (same shape; a tensor or a numpy array). Example:
    [0, 40, 63, 64, 100, 500] -> [0, 0, 0, 32, 64, 448]."""
    return ((positions - DEPTH).clip(min=0) // BLOCK) * BLOCK


@dataclass(frozen=True)
class TailWindows:
    """The tails of a forward where every query row's keys [S, t] sit at columns S..t of its
    batch row (column = position: a chain, a decode step): one flash entry per (batch row, S)
    reads the TAIL columns from S in place, all that batch row's query rows in it."""

    batch: list[int]  # [E] batch row of each entry, entries sorted by (batch row, S)
    start: list[int]  # [E] its S
    mask: torch.Tensor  # [E, 1, head_rows, TAIL] additive: a member row keeps slots 0..t - S
    entry: torch.Tensor | None  # [b, 1, 1, q, 1] entry of each query row (None: entry = batch row)
    views: dict = field(default_factory=dict)  # cache geometry -> its windows view (`tail_windows`)


@dataclass(frozen=True)
class InvariantLayout:
    """What every attention layer of one forward needs, built once (`layout`); G query heads
    share a key/value head, and a batch row's G * q query rows are head-major (g * q + i).
    Every query row is computed (R = b * q, row r = b * q + i). The tail part reads `windows`
    where it can, else each row's own gathered columns (`tail_*`)."""

    heads_per_kv: int  # G
    queries: int  # q query rows per batch row
    head_rows: int  # G * q, padded so no flash query block holds a single row
    flash_calls: list[
        tuple[int, int, int]
    ]  # (first, end, width): batch rows [first, end) in one call
    flash_mask: list[torch.Tensor | None]  # per call: [end - first, 1, head_rows, width] additive
    keyless: torch.Tensor | None  # [b, 1, 1, q] rows without keys before S (None: no such row)
    windows: TailWindows | None = None
    tail_batch: torch.Tensor | None = None  # [R] batch row of each query row
    tail_columns: torch.Tensor | None = None  # [R, TAIL] key columns of positions S..t (0-padded)
    tail_mask: torch.Tensor | None = None  # [R, 1, G', TAIL] additive: slots past t masked
    gather_index: dict = field(default_factory=dict)  # (strides) -> flat index (`_gather`)


def flash_calls(widths: list[int], head_rows: int) -> list[tuple[int, int, int]]:
    """Batch rows [first, end) that share one flash call, padded to their widest row, and that
    width: the partition of the rows, in order, with the least estimated cost (CALL_COST per call
    plus rows x head_rows x width), rows that read no columns left out. Example (head_rows 3):
    widths [300, 300, 0, 32, 800] -> [(0, 2, 300), (3, 4, 32), (4, 5, 800)]."""
    n = len(widths)
    best = [0.0] + [float("inf")] * n  # best[e]: least cost of rows [0, e)
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        widest = 0
        for first in range(end - 1, -1, -1):
            widest = max(widest, widths[first])
            cost = best[first] + (CALL_COST + (end - first) * head_rows * widest if widest else 0)
            if cost < best[end]:
                best[end], cut[end] = cost, first
    calls, end = [], n
    while end > 0:
        first = cut[end]
        widest = max(widths[first:end])
        if widest:
            calls.append((first, end, widest))
        end = first
    return calls[::-1]


def _head_rows(heads_per_kv: int, q: int) -> int:
    """G * q, plus one padding row where the flash kernel's last query block (32 rows; 64 or
    256 for long inputs, all multiples of 32) would hold a single row, which takes another path.
    Example: G 3, q 11 -> 34 (33 would leave row 32 alone)."""
    rows = heads_per_kv * q
    return rows + 1 if rows % 32 == 1 else rows


def layout(
    allowed: torch.Tensor, positions: torch.Tensor, heads_per_kv: int, dtype, device
) -> InvariantLayout:
    """The layout of a forward whose query rows [b, q] sit at `positions` and may attend the key
    columns `allowed` [b, q, columns] marks. Every row must see columns [0, S(t)) (its held
    positions, in order) and at most TAIL columns from S(t) on; raises `DraftTooDeep` otherwise.
    (Built in numpy: a forward's small index arithmetic costs a third of torch's there.)"""
    allowed, positions = allowed.cpu().numpy(), positions.cpu().numpy()
    b, q, columns = allowed.shape
    split = split_point(positions)  # [b, q]
    head_rows = _head_rows(heads_per_kv, q)
    calls = flash_calls(split.max(axis=1).tolist(), head_rows)
    masks = [
        _flash_mask(allowed[a:e], split[a:e], w, heads_per_kv, head_rows, dtype, device)
        for a, e, w in calls
    ]
    column = np.arange(columns)[None, None, :]
    from_split = column >= split[..., None]  # [b, q, columns]
    tail = allowed & from_split
    counts = tail.sum(axis=2)  # [b, q]
    if int(counts.max()) > TAIL:
        raise DraftTooDeep(
            f"a query row attends {int(counts.max())} keys past its split point; the invariant "
            f"attention takes at most {TAIL} (drafts up to {DEPTH} positions deep)"
        )
    if np.array_equal(tail, from_split & (column <= positions[..., None])):
        tails = {"windows": _windows(split, positions, heads_per_kv, head_rows, dtype, device)}
    else:
        tails = _gathered(tail, counts, heads_per_kv, dtype, device)
    covered = np.zeros(b, dtype=bool)
    for a, e, _ in calls:
        covered[a:e] = True
    keyless = (split == 0) & covered[:, None]  # [b, q] rows fully masked in a call
    return InvariantLayout(
        heads_per_kv=heads_per_kv,
        queries=q,
        head_rows=head_rows,
        flash_calls=calls,
        flash_mask=masks,
        keyless=torch.from_numpy(keyless)[:, None, None, :].to(device) if keyless.any() else None,
        **tails,
    )


def _windows(split, positions, group: int, head_rows: int, dtype, device) -> TailWindows:
    """One entry per (batch row, S); a query row is a member of its own S's entry and keeps
    slots 0..t - S there (elsewhere slot 0 only: computed, never read). Example: one batch row,
    positions [300, 301] -> one entry (0, 256), the rows keeping slots 0..44 and 0..45."""
    b, q = split.shape
    span = int(split.max()) + 1
    unique, entry_of = np.unique(np.arange(b)[:, None] * span + split, return_inverse=True)
    entry_of = entry_of.reshape(b, q)
    batch, start = unique // span, unique % span  # [E]
    member = entry_of[batch] == np.arange(len(unique))[:, None]  # [E, q]
    limit = np.where(member, positions[batch] - start[:, None], 0)  # [E, q]
    keep = np.arange(TAIL)[None, None, :] <= limit[..., None]  # [E, q, TAIL]
    rows = np.tile(keep, (1, group, 1))  # [E, G q, TAIL], head-major
    if head_rows > rows.shape[1]:
        rows = np.concatenate([rows, rows[:, :1]], axis=1)
    entry = torch.from_numpy(entry_of)[:, None, None, :, None].to(device)
    return TailWindows(
        batch=batch.tolist(),
        start=start.tolist(),
        mask=_additive(rows, dtype, device)[:, None],
        entry=None if len(unique) == b else entry,
    )


def _gathered(tail, counts, group: int, dtype, device) -> dict:
    """The per-row tail (rows whose keys past S are not in place, e.g. a tree's branches): the
    columns of positions S..t in order, one flash entry per query row."""
    b, q, _ = tail.shape
    counts = counts.reshape(-1)  # [R]
    order = np.argsort(~tail.reshape(b * q, -1), axis=1, kind="stable")
    columns = order[:, :TAIL]  # allowed columns first, in column (= position) order
    columns = np.pad(columns, ((0, 0), (0, TAIL - columns.shape[1])))  # short caches
    slots = np.arange(TAIL)[None, :] < counts[:, None]  # [R, TAIL]
    columns = np.where(slots, columns, 0)
    group = max(group, 2)  # the flash kernel's lone-row path again: never one query row
    tail_mask = _additive(slots, dtype, device)[:, None, None, :].expand(-1, 1, group, -1)
    return {
        "tail_batch": torch.arange(b).repeat_interleave(q).to(device),
        "tail_columns": torch.from_numpy(columns).to(device),
        "tail_mask": tail_mask.contiguous(),
    }


def _flash_mask(allowed, split, width: int, group: int, head_rows: int, dtype, device):
    """The flash mask [b, 1, head_rows, width]: query row i of batch row r keeps [0, split[r, i])
    (which it must see: its held positions; the rest is a masked tail, measured invariant at any
    width); None where every row keeps every column (the kernel gives the same bits unmasked)."""
    keep = np.arange(width)[None, None, :] < split[..., None]  # [b, q, width]
    if (keep & ~allowed[:, :, :width]).any():
        raise DraftTooDeep(
            "a query row does not see every position before its split point: its row's held "
            f"positions end less than {DEPTH} before it"
        )
    if keep.all():
        return None
    rows = np.tile(keep, (1, group, 1))  # [b, G * q, width], head-major
    if head_rows > rows.shape[1]:
        rows = np.concatenate([rows, rows[:, :1]], axis=1)
    return _additive(rows, dtype, device)[:, None]


def _additive(allowed: np.ndarray, dtype, device) -> torch.Tensor:
    """0 where `allowed`, -inf elsewhere, as a `dtype` tensor on `device`."""
    mask = np.where(allowed, np.float32(0), np.float32(-np.inf))
    return torch.from_numpy(mask).to(device=device, dtype=dtype)
