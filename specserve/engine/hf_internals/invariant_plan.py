"""The plan (layout) of a position-invariant forward (`invariant`), built once per forward: each query
row's split point S(t), the flash calls over keys [0, S) and the columns its keys [S, t] sit at
(S..t for a chain or a decode step; a tree's branches elsewhere)."""

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
    if isinstance(positions, np.ndarray):  # np.maximum: a tenth of `clip`'s cost
        return (np.maximum(positions - DEPTH, 0) // BLOCK) * BLOCK
    return ((positions - DEPTH).clip(min=0) // BLOCK) * BLOCK


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
    keyless: torch.Tensor | None  # [b, 1, head_rows] rows without keys before S (None: none)
    tail_columns: torch.Tensor  # [R, TAIL] int32 key columns of positions S..t (0-padded)
    tail_counts: torch.Tensor  # [R] int32: t - S + 1 keys each
    kernel_args: dict = field(default_factory=dict)  # geometry -> the tail kernel's ints


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


# the fewest rows a flash query block may hold: smaller blocks take another path (a single row
# on an AMX Xeon; 1-3 rows on a Zen 4, where every block of 4 or more rows agrees)
MIN_BLOCK_ROWS = 4


def padded_head_rows(heads_per_kv: int, q: int) -> int:
    """G * q, plus padding rows (copies of the first) where the flash kernel's last query block
    (32 rows; 64 or 256 for long inputs, all multiples of 32) would hold fewer than
    MIN_BLOCK_ROWS. Examples: G 3, q 1 -> 4; G 3, q 11 -> 36 (33 would leave row 32 alone)."""
    rows = heads_per_kv * q
    short = rows % 32
    return rows + MIN_BLOCK_ROWS - short if 0 < short < MIN_BLOCK_ROWS else rows


def pad_rows(rows: np.ndarray, head_rows: int) -> np.ndarray:
    """[b, G q, ...] -> [b, head_rows, ...]: the padding rows are copies of row 0."""
    extra = head_rows - rows.shape[1]
    return np.concatenate([rows, np.repeat(rows[:, :1], extra, axis=1)], axis=1) if extra else rows


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
    head_rows = padded_head_rows(heads_per_kv, q)
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
    if np.array_equal(tail, from_split & (column <= positions[..., None])):  # in place
        at = np.minimum(split.reshape(-1, 1) + np.arange(TAIL)[None, :], columns - 1)
    else:
        at = _gathered(tail, counts)
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
        keyless=_head_major(keyless, heads_per_kv, head_rows, device) if keyless.any() else None,
        tail_columns=torch.from_numpy(at.astype(np.int32)).to(device),
        tail_counts=torch.from_numpy(counts.reshape(-1).astype(np.int32)).to(device),
    )


def _head_major(rows: np.ndarray, group: int, head_rows: int, device) -> torch.Tensor:
    """[b, q] per query row -> [b, 1, head_rows]: head-major (g q + i), the padding rows last."""
    tiled = pad_rows(np.tile(rows, (1, group)), head_rows)  # [b, head_rows]
    return torch.from_numpy(tiled)[:, None, :].to(device)


def _gathered(tail: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """[R, TAIL] per query row the columns its keys past S sit at (`tail` [b, q, columns], `counts`
    [b, q] of them), in column (= position) order, 0-padded: the layout of rows whose keys are
    not in place (a tree's branches)."""
    b, q, _ = tail.shape
    order = np.argsort(~tail.reshape(b * q, -1), axis=1, kind="stable")
    columns = order[:, :TAIL]  # allowed columns first, in column (= position) order
    columns = np.pad(columns, ((0, 0), (0, TAIL - columns.shape[1])))  # short caches
    slots = np.arange(TAIL)[None, :] < counts.reshape(-1, 1)
    return np.where(slots, columns, 0)


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
    rows = pad_rows(np.tile(keep, (1, group, 1)), head_rows)  # [b, head_rows, width]
    return _additive(rows, dtype, device)[:, None]


def _additive(allowed: np.ndarray, dtype, device) -> torch.Tensor:
    """0 where `allowed`, -inf elsewhere, as a `dtype` tensor on `device`."""
    mask = np.where(allowed, np.float32(0), np.float32(-np.inf))
    return torch.from_numpy(mask).to(device=device, dtype=dtype)
