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
    reads the TAIL columns from S in place, with the query rows of that S (its members: m rows
    at most, G m head rows, the last member repeated as padding)."""

    batch: list[int]  # [E] batch row of each entry, entries sorted by (batch row, S)
    start: list[int]  # [E] its S
    mask: torch.Tensor  # [E, 1, window_rows, TAIL] additive: a member keeps slots 0..t - S
    source: torch.Tensor | None  # [E window_rows] folded query row (b head_rows + g q + i) of each
    back: torch.Tensor | None  # [b G q] entry row (e window_rows + g m + j) of each query row
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
    """One entry per (batch row, S) holding the query rows of that S, each keeping slots
    0..t - S; with one S per batch row the entries are the folded query as it is (no copies).
    Example: one batch row, positions [300, 301] -> one entry (0, 256), rows keeping slots 0..44
    and 0..45; positions [62, 63, 64, 65] -> entries (0, 0) and (0, 32), two members each."""
    b, q = split.shape
    span = int(split.max()) + 1
    unique, entry_of = np.unique(np.arange(b)[:, None] * span + split, return_inverse=True)
    batch, start = unique // span, unique % span  # [E]
    if len(unique) == b:  # every batch row one entry, all its rows members, in place
        mask = _tail_mask(positions - start[:, None], group, head_rows, dtype, device)
        return TailWindows(batch.tolist(), start.tolist(), mask, source=None, back=None)
    entry_of = entry_of.reshape(-1)  # [b q]
    members = [np.flatnonzero(entry_of == e) for e in range(len(unique))]  # flat rows b q + i
    m = max(len(rows) for rows in members)
    window_rows = _head_rows(group, m)
    slot = np.stack([np.pad(rows, (0, m - len(rows)), mode="edge") for rows in members])  # [E, m]
    mask = _tail_mask(
        positions.reshape(-1)[slot] - start[:, None], group, window_rows, dtype, device
    )
    row, i = np.divmod(slot, q)  # [E, m]
    source = (row * head_rows)[:, None] + (np.arange(group) * q)[None, :, None] + i[:, None]
    source = source.reshape(len(unique), group * m)  # [E, G m], head-major like the fold
    if window_rows > group * m:
        source = np.concatenate([source, source[:, :1]], axis=1)
    rank = np.zeros(b * q, dtype=np.int64)  # j: a row's place among its entry's members
    for rows in members:
        rank[rows] = np.arange(len(rows))
    back = entry_of.reshape(b, 1, q) * window_rows + np.arange(group)[None, :, None] * m
    back = back + rank.reshape(b, 1, q)  # [b, G, q]
    return TailWindows(
        batch.tolist(),
        start.tolist(),
        mask,
        source=torch.from_numpy(source.reshape(-1)).to(device),
        back=torch.from_numpy(back.reshape(-1)).to(device),
    )


def _tail_mask(limit, group: int, rows: int, dtype, device) -> torch.Tensor:
    """[n, 1, rows, TAIL] additive: member j of entry e keeps slots 0..limit[e, j] (head-major
    G x m rows, then a padding row where `rows` has one)."""
    keep = np.arange(TAIL)[None, None, :] <= limit[..., None]  # [n, m, TAIL]
    keep = np.tile(keep, (1, group, 1))  # [n, G m, TAIL]
    if rows > keep.shape[1]:
        keep = np.concatenate([keep, keep[:, :1]], axis=1)
    return _additive(keep, dtype, device)[:, None]


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
