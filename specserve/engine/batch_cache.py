"""One KV cache shared by the rows of a decode batch, with per-row visible positions.

Every forward writes q columns into every row; a row keeps (marks visible) only the columns of
its committed tokens, so rows of different lengths and accept counts share one tensor without
copies. Ragged (the cache and attention allow it): row b writes right after its own last kept
column (`ends()[b]`) and attends only [0, ends()[b] + q), so short rows neither grow with nor read
the long ones. Otherwise every row writes after the common end. Columns carry their rotary
positions in the keys, so their order never matters. A leaving row's slot is reused by the next
request that fits; free slots and hidden columns are reclaimed by `compact`, one gather.
"""

from __future__ import annotations

import torch

from specserve.engine import hf_internals


class BatchKV:
    """Rows are identified by their index; `visible` [rows, columns] marks what each row attends."""

    def __init__(self, config, ragged: bool = True) -> None:
        """`ragged`: rows write at their own end where the cache allows it (the mask keeps any
        attention exact; `hf_internals.enable_row_attention` makes it skip the rest)."""
        self.config = config
        self.cache = hf_internals.new_batch_cache(config)
        self.ragged = ragged and hf_internals.row_writes(self.cache)
        with torch.inference_mode():  # every update happens in inference mode (see the methods)
            self.visible = torch.zeros(0, 0, dtype=torch.bool)  # [rows, columns]
        self._starts: list[int] = []  # per row: where the last forward wrote its first column
        self.free: list[int] = []  # rows no request holds (padding in a forward until reused)

    @property
    def rows(self) -> int:
        return self.visible.shape[0]

    @property
    def columns(self) -> int:
        return self.visible.shape[1]

    def lengths(self) -> list[int]:
        """Positions each row holds."""
        return self.visible.sum(dim=1).tolist()

    def ends(self) -> list[int]:
        """Per row, 1 + its last held column (0 when it holds none). Example: visible
        [[T, F, T, F], [F, F, F, F]] -> [3, 0]."""
        if self.columns == 0:
            return [0] * self.rows
        last = self.columns - self.visible.flip(1).int().argmax(dim=1)  # [rows]
        return torch.where(self.visible.any(dim=1), last, 0).tolist()

    @torch.inference_mode()
    def add(self, row_cache, length: int) -> int:
        """Put a request's own cache (its first `length` positions) in a free row that is wide
        enough, else in a new row; returns the row."""
        if self.rows == 0:
            self.cache = hf_internals.new_batch_cache(self.config)
        if self.free and length <= self.columns:
            row = self.free.pop()
            hf_internals.write_row(self.cache, row, row_cache, length)
            self.visible[row] = False
            self.visible[row, :length] = True
            return row
        hf_internals.append_row(self.cache, row_cache, length)
        width = max(self.columns, length)
        visible = torch.zeros(self.rows + 1, width, dtype=torch.bool)
        visible[: self.rows, : self.columns] = self.visible
        visible[self.rows, :length] = True
        self.visible = visible
        return self.rows - 1

    @torch.inference_mode()
    def release(self, row: int) -> None:
        """The row's request left: its slot is free (it attends nothing until reused)."""
        self.visible[row] = False
        self.free.append(row)

    @torch.inference_mode()
    def begin(self, q: int) -> list[int]:
        """A forward of q query rows is about to run: per row, the column its first new entry
        goes to (the cache is told so). The new columns stay hidden until `keep` marks them."""
        starts = self.ends() if self.ragged else [self.columns] * self.rows
        if self.ragged:
            hf_internals.set_write_columns(self.cache, starts)
        width = max(starts, default=0) + q  # the cache's used part after the forward
        if width >= self.columns:  # (columns past every row's end are all hidden)
            extra = torch.zeros(self.rows, width - self.columns, dtype=torch.bool)
            self.visible = torch.cat([self.visible, extra], 1)
        else:
            self.visible = self.visible[:, :width].clone()
        self._starts = starts
        return starts

    def extents(self, q: int) -> list[int] | None:
        """Per row, the columns the forward `begin(q)` announced may attend: [0, start + q)
        (None when not ragged: every row attends every column)."""
        return [start + q for start in self._starts] if self.ragged else None

    @torch.inference_mode()
    def keep(self, row: int, new_columns: list[int]) -> None:
        """Mark columns of the last forward (0 = its first query row) as held by `row`."""
        start = self._starts[row]
        for c in new_columns:
            self.visible[row, start + c] = True

    @torch.inference_mode()
    def compact(self, keep_rows: list[int]) -> None:
        """Keep only `keep_rows` (in this order), each row's visible columns packed to the left."""
        self.free = []
        if not keep_rows:
            self.cache = hf_internals.new_batch_cache(self.config)
            self.visible = torch.zeros(0, 0, dtype=torch.bool)
            return
        visible = self.visible[keep_rows]  # [rows', columns]
        lengths = visible.sum(dim=1)
        width = int(lengths.max())
        columns = torch.zeros(len(keep_rows), width, dtype=torch.long)
        packed = torch.zeros(len(keep_rows), width, dtype=torch.bool)
        for i, row in enumerate(visible):
            held = row.nonzero().flatten()
            columns[i, : len(held)] = held
            packed[i, : len(held)] = True
        hf_internals.gather_rows(self.cache, torch.tensor(keep_rows), columns)
        self.visible = packed

    def wasted(self) -> float:
        """Fraction of the columns the rows' attention reads that no row holds (what `compact`
        would save): hidden columns inside each row's extent (ragged), or the columns past the
        longest row (not ragged)."""
        if self.rows == 0 or self.columns == 0:
            return 0.0
        if self.ragged:
            return 1.0 - sum(self.lengths()) / max(sum(self.ends()), 1)
        return 1.0 - max(self.lengths()) / self.columns

    def needs_compaction(self) -> bool:
        """Worth one whole-cache gather: most columns hidden (and many), or a quarter of the rows
        (at least two) free, or every row free."""
        if self.rows and len(self.free) == self.rows:
            return True
        if len(self.free) >= max(2, self.rows // 4):
            return True
        return self.wasted() > 0.5 and self.columns > 256
