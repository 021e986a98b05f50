"""One KV cache shared by the rows of a decode batch, with per-row visible positions.

Layers are grouped by attention type, each group (`Columns`) with its own column layout:
full-attention layers keep every committed position; sliding-window layers keep each row's last
window - 1 (older columns are dropped when the group is compacted), so their memory stays
bounded however long a generation runs. Within a group, every forward writes q columns into every
row; a row keeps (marks visible) only the columns of its committed tokens, so rows of different
lengths and accept counts share one tensor without copies. Ragged (the cache and attention allow
it): row b writes right after its own last kept column and attends only [0, end_b + q), so short
rows neither grow with nor read the long ones. Otherwise every row writes after the common end.
Columns carry their rotary positions in the keys, so their order never matters. A leaving row's
slot is reused by the next request that fits; free slots and hidden columns are reclaimed by
`compact`, one gather per group.
"""

from __future__ import annotations

import torch

from specserve.engine import hf_internals


class Columns:
    """The column layout of one group of cache layers (`layers`: indices; `window`: their
    sliding window, None for full attention). `visible` [rows, columns] marks what each row
    attends; row b's first column holds position `offsets[b]` (0 unless the window dropped some)."""

    def __init__(self, layers: tuple[int, ...], window: int | None, pack: bool = False) -> None:
        self.layers = layers
        self.window = window
        self.pack_kept = pack  # `keep` packs kept columns after the row's own (else marks them)
        with torch.inference_mode():  # every update happens in inference mode (see BatchKV)
            self.visible = torch.zeros(0, 0, dtype=torch.bool)  # [rows, columns]
        self.offsets: list[int] = []  # per row: positions it no longer holds
        self.starts: list[int] = []  # per row: where the last forward wrote its first column
        self.moves: list[tuple[int, int, int]] = []  # (row, from, to) columns `pack` moves

    @property
    def rows(self) -> int:
        return self.visible.shape[0]

    @property
    def columns(self) -> int:
        return self.visible.shape[1]

    def ends(self) -> list[int]:
        """Per row, 1 + its last held column (0 when it holds none). Example: visible
        [[T, F, T, F], [F, F, F, F]] -> [3, 0]."""
        if self.columns == 0:
            return [0] * self.rows
        last = self.columns - self.visible.flip(1).int().argmax(dim=1)  # [rows]
        return torch.where(self.visible.any(dim=1), last, 0).tolist()

    def first(self, length: int) -> int:
        """The oldest position a row of `length` positions must hold: 0, or for a window group the
        first of its last window - 1 (a query at position >= length sees no older one)."""
        return 0 if self.window is None else max(0, length - (self.window - 1))

    def fits(self, length: int) -> bool:
        return length - self.first(length) <= self.columns

    def write(self, cache, row: int, row_cache, length: int) -> None:
        """Put a request's positions in the free row `row` (it fits)."""
        self.pack(cache)
        first = self.first(length)
        hf_internals.write_row(cache, row, row_cache, length, self.layers, first)
        self.visible[row] = False
        self.visible[row, : length - first] = True
        self.offsets[row] = first

    def append(self, cache, row_cache, length: int) -> None:
        """Put a request's positions in a new last row."""
        self.pack(cache)
        first = self.first(length)
        hf_internals.append_row(cache, row_cache, length, self.layers, first)
        width = max(self.columns, length - first)
        visible = torch.zeros(self.rows + 1, width, dtype=torch.bool)
        visible[: self.rows, : self.columns] = self.visible
        visible[self.rows, : length - first] = True
        self.visible = visible
        self.offsets.append(first)

    def release(self, row: int) -> None:
        self.moves = [m for m in self.moves if m[0] != row]
        self.visible[row] = False
        self.offsets[row] = 0

    def begin(self, cache, q: int, ragged: bool) -> None:
        """A forward of q query rows is about to run: choose each row's write column (and tell
        the cache); the new columns stay hidden until `keep` marks them."""
        self.pack(cache)
        starts = self.ends() if ragged else [self.columns] * self.rows
        if ragged:
            hf_internals.set_write_columns(cache, starts, self.layers)
        width = max(starts, default=0) + q  # the group's used part after the forward
        if width >= self.columns:  # (columns past every row's end are all hidden)
            extra = torch.zeros(self.rows, width - self.columns, dtype=torch.bool)
            self.visible = torch.cat([self.visible, extra], 1)
        else:
            self.visible = self.visible[:, :width].clone()
        self.starts = starts

    def keep(self, row: int, new_columns: list[int]) -> None:
        """Hold the last forward's `new_columns` (0 = its first); packing, the i-th kept goes to
        column start + i (`pack` moves the entries), so a row's positions stay at columns 0, 1,
        ... in order (what the invariant attention reads); else they stay where they are."""
        start = self.starts[row]
        for i, c in enumerate(sorted(new_columns)):
            at = i if self.pack_kept else c
            self.visible[row, start + at] = True
            if c != at:
                self.moves.append((row, start + c, start + at))

    def pack(self, cache) -> None:
        """Carry out the moves `keep` recorded (one indexed copy per layer for every row)."""
        if not self.moves:
            return
        rows, src, dst = (torch.tensor(m) for m in zip(*self.moves, strict=True))
        hf_internals.move_columns(cache, rows, src, dst, self.layers)
        self.moves = []

    def compact(self, cache, keep_rows: list[int]) -> None:
        """Keep only `keep_rows` (in this order), each row's visible columns packed to the left;
        a window group keeps only each row's last window - 1 of them."""
        self.pack(cache)
        visible = self.visible[keep_rows]  # [rows', columns]
        held = [row.nonzero().flatten() for row in visible]
        offsets = [self.offsets[r] for r in keep_rows]
        if self.window is not None:
            drops = [max(0, len(h) - (self.window - 1)) for h in held]
            held = [h[d:] for h, d in zip(held, drops, strict=True)]
            offsets = [o + d for o, d in zip(offsets, drops, strict=True)]
        width = max(len(h) for h in held)
        columns = torch.zeros(len(keep_rows), width, dtype=torch.long)
        packed = torch.zeros(len(keep_rows), width, dtype=torch.bool)
        for i, h in enumerate(held):
            columns[i, : len(h)] = h
            packed[i, : len(h)] = True
        hf_internals.gather_rows(cache, torch.tensor(keep_rows), columns, self.layers)
        self.visible, self.offsets = packed, offsets

    def positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        """[rows, columns]: the position each column holds during the forward `begin` set up,
        whose query positions are `position_ids` [rows, q] (see `column_positions`)."""
        return column_positions(self.visible, self.starts, position_ids, self.offsets)

    def wasted(self, ragged: bool) -> float:
        """Fraction of the columns the rows' attention reads that no row holds."""
        if self.rows == 0 or self.columns == 0:
            return 0.0
        held = self.visible.sum(dim=1).tolist()
        if ragged:
            return 1.0 - sum(held) / max(sum(self.ends()), 1)
        return 1.0 - max(held) / self.columns

    def stale(self) -> bool:
        """A window group holding about twice what its rows still need (worth a compaction)."""
        return self.window is not None and self.columns > 2 * (self.window - 1) + 16


def column_positions(
    visible: torch.Tensor,
    starts: list[int],
    position_ids: torch.Tensor,
    offsets: list[int] | None = None,
) -> torch.Tensor:
    """[b, columns]: the position each row's column holds (held columns before the row's start
    count offsets[b], offsets[b] + 1, ...; the new block [start, start + q) takes
    `position_ids` [b, q]; others are never attended). Example: visible [[T, F, T, F, F]],
    starts [3], position_ids [[2, 3]] -> [[0, 0, 1, 2, 3]]; with offsets [5]: [[5, 5, 6, 2, 3]]."""
    positions = visible.long().cumsum(dim=1) - 1  # [b, columns]
    if offsets is not None:
        positions += torch.tensor(offsets, dtype=torch.long)[:, None]
    q = position_ids.shape[1]
    for b, start in enumerate(starts):
        positions[b, start : start + q] = position_ids[b]
    return positions


class BatchKV:
    """Rows are identified by their index (the same in every group); `visible` is the first
    group's (full attention where the model has any)."""

    def __init__(self, config, ragged: bool = True, pack: bool = False) -> None:
        """`ragged`: rows write at their own end where the cache allows it (the mask keeps any
        attention exact; `hf_internals.enable_row_attention` makes it skip the rest). `pack`:
        kept columns move right after each row's own, so column = position (the invariant
        attention needs it)."""
        self.config = config
        self.pack = pack
        self.cache = hf_internals.new_batch_cache(config)
        self.ragged = ragged and hf_internals.row_writes(self.cache)
        self.groups = self._groups()
        self.free: list[int] = []  # rows no request holds (padding in a forward until reused)

    def _groups(self) -> list[Columns]:
        windows = hf_internals.layer_windows(self.config)
        full = tuple(i for i, w in enumerate(windows) if w is None)
        windowed = tuple(i for i, w in enumerate(windows) if w is not None)
        groups = [Columns(full, None, self.pack)] if full else []
        if windowed:
            groups.append(Columns(windowed, hf_internals.window(self.config), self.pack))
        return groups

    @property
    def visible(self) -> torch.Tensor:
        return self.groups[0].visible

    @property
    def rows(self) -> int:
        return self.groups[0].rows

    @property
    def columns(self) -> int:
        return self.groups[0].columns

    def lengths(self) -> list[int]:
        """Positions each row holds (counting those a window dropped)."""
        group = self.groups[0]
        held = group.visible.sum(dim=1).tolist()
        return [o + h for o, h in zip(group.offsets, held, strict=True)]

    def ends(self) -> list[int]:
        return self.groups[0].ends()

    @torch.inference_mode()
    def add(self, row_cache, length: int) -> int:
        """Put a request's own cache (its first `length` positions) in a free row that is wide
        enough, else in a new row; returns the row."""
        if self.rows == 0:
            self.cache = hf_internals.new_batch_cache(self.config)
            self.groups = self._groups()
        if self.free and all(g.fits(length) for g in self.groups):
            row = self.free.pop()
            for g in self.groups:
                g.write(self.cache, row, row_cache, length)
            return row
        for g in self.groups:
            g.append(self.cache, row_cache, length)
        return self.rows - 1

    @torch.inference_mode()
    def release(self, row: int) -> None:
        """The row's request left: its slot is free (it attends nothing until reused)."""
        for g in self.groups:
            g.release(row)
        self.free.append(row)

    @torch.inference_mode()
    def begin(self, q: int) -> list[int]:
        """A forward of q query rows is about to run: per row, the column its first new entry
        goes to in the first group (every group is told its own). The new columns stay hidden
        until `keep` marks them."""
        for g in self.groups:
            g.begin(self.cache, q, self.ragged)
        return self.groups[0].starts

    def extents(self, q: int) -> list[int] | dict[str, list[int]] | None:
        """Per row, the columns the forward `begin(q)` announced may attend: [0, start + q)
        (None when not ragged: every row attends every column); with two groups, one list per
        layer type ("full_attention", "sliding_attention")."""
        if not self.ragged:
            return None
        per_group = {
            "full_attention" if g.window is None else "sliding_attention": [s + q for s in g.starts]
            for g in self.groups
        }
        return next(iter(per_group.values())) if len(per_group) == 1 else per_group

    @torch.inference_mode()
    def keep(self, row: int, new_columns: list[int]) -> None:
        """Mark columns of the last forward (0 = its first query row) as held by `row`."""
        for g in self.groups:
            g.keep(row, new_columns)

    @torch.inference_mode()
    def compact(self, keep_rows: list[int]) -> None:
        """Keep only `keep_rows` (in this order), each row's visible columns packed to the left
        (window groups: only what the window still sees)."""
        self.free = []
        if not keep_rows:
            self.cache = hf_internals.new_batch_cache(self.config)
            self.groups = self._groups()
            return
        for g in self.groups:
            g.compact(self.cache, keep_rows)

    @torch.inference_mode()
    def trim_windows(self) -> None:
        """Compact only the window groups that hold about twice their window (every row stays,
        in place), so the full layers are not gathered for it."""
        for g in self.groups:
            if self.rows and g.stale():
                g.compact(self.cache, list(range(self.rows)))

    def wasted(self) -> float:
        """Fraction of the columns the first group's attention reads that no row holds (what
        `compact` would save): hidden columns inside each row's extent (ragged), or the columns
        past the longest row (not ragged)."""
        return self.groups[0].wasted(self.ragged)

    def needs_compaction(self) -> bool:
        """Worth one whole-cache gather: most columns hidden (and many), or a quarter of the rows
        (at least two) free, or every row free (window groups: `trim_windows`)."""
        if self.rows and len(self.free) == self.rows:
            return True
        if len(self.free) >= max(2, self.rows // 4):
            return True
        return self.wasted() > 0.5 and self.columns > 256
