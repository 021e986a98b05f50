"""One KV cache shared by the rows of a decode batch, with per-row visible positions.

Every forward appends q columns to every row; a row keeps (marks visible) only the columns of its
committed tokens, so rows of different lengths and accept counts share one tensor without copies.
Columns carry their rotary positions in the keys, so their order never matters. A leaving row's
slot is reused by the next request that fits (one row written, no whole-cache copy); free slots
and hidden columns are reclaimed by `compact`, one gather of the whole cache.
"""

from __future__ import annotations

import torch

from specserve.engine import hf_internals


class BatchKV:
    """Rows are identified by their index; `visible` [rows, columns] marks what each row attends."""

    def __init__(self, config) -> None:
        self.config = config
        self.cache = hf_internals.new_batch_cache(config)
        with torch.inference_mode():  # every update happens in inference mode (see the methods)
            self.visible = torch.zeros(0, 0, dtype=torch.bool)  # [rows, columns]
        self._last_q = 0  # columns the last forward appended
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
    def grow(self, q: int) -> None:
        """A forward appended `q` columns to every row, all hidden until `keep` marks them."""
        self.visible = torch.cat([self.visible, torch.zeros(self.rows, q, dtype=torch.bool)], 1)
        self._last_q = q

    @torch.inference_mode()
    def keep(self, row: int, new_columns: list[int]) -> None:
        """Mark columns of the last forward (0 = its first query row) as held by `row`."""
        start = self.columns - self._last_q
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
        """Fraction of the cache's columns no row attends (what `compact` would reclaim)."""
        if self.rows == 0 or self.columns == 0:
            return 0.0
        return 1.0 - max(self.lengths()) / self.columns

    def needs_compaction(self) -> bool:
        """Worth one whole-cache gather: most columns hidden (and many), or a quarter of the rows
        (at least two) free, or every row free."""
        if self.rows and len(self.free) == self.rows:
            return True
        if len(self.free) >= max(2, self.rows // 4):
            return True
        return self.wasted() > 0.5 and self.columns > 256
