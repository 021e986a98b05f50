"""The decode batch's rows (`DecodeRows`, mixed into `Scheduler`): one verify forward over every
decoding row (drafts cut by load for load-aware rows), each row's verdict and commit, and rows
leaving the batch (slots reused or compacted). It works on the scheduler's `engine`, `kv`,
`slots` and `relative_cost`, set up by `Scheduler.__init__`.
"""

from __future__ import annotations

from specserve.engine.batch.spec_budget import RowDraft, choose_cap
from specserve.engine.batch.tickets import Ticket
from specserve.engine.decode.state import feature_layers
from specserve.engine.forward.batch import verify_batch_forward
from specserve.engine.forward.batch_rows import BatchRow
from specserve.engine.lora.batch import BASE_ADAPTER, takes_adapters
from specserve.engine.tree import Draft, cap_draft


class DecodeRows:
    """The loop thread's decode step over the batch's rows."""

    def _decode(self) -> None:
        live = self.decoding
        drafts = {t.id: self.engine.propose(t.state) for t in live}
        cap = self._cap([drafts[t.id] for t in live], live)
        lengths = self.kv.lengths()
        rows = [self._row(t, drafts, cap, lengths[b]) for b, t in enumerate(self.slots)]
        outs = verify_batch_forward(self.engine.model, self.kv, rows, self.engine.pad_width)
        finished = []
        for b, (ticket, row, out) in enumerate(zip(self.slots, rows, outs, strict=True)):
            if ticket is None:
                continue
            verdict = self.engine.accept(ticket.state, row.draft, out)
            p = len(row.pending)
            self.kv.keep(b, list(range(p)) + [p + i for i in verdict.accepted])
            step = self.engine.commit(ticket.state, row.draft, out, verdict)
            ticket.sink(step, False)
            if ticket.state.done:
                finished.append(ticket)
        if finished:
            self._leave(finished)
        elif self.kv.needs_compaction():
            self._compact()
        self.kv.trim_windows()  # window layers keep about their window, however long rows run

    def _row(self, ticket: Ticket | None, drafts: dict, cap: int | None, past: int) -> BatchRow:
        """The forward input of one batch row: a request's pending token and (cut) draft, or an
        inert padding token for a free row."""
        if ticket is None:
            return BatchRow(0, [0], Draft(), self._padding_adapter())
        state, draft = ticket.state, drafts[ticket.id]
        if cap is not None and ticket.load_aware:
            cut = cap_draft(draft, cap)
            state.capped_steps += cut is not draft
            draft = cut
        return BatchRow(past, state.pending, draft, state.adapter, feature_layers(state))

    def _padding_adapter(self) -> str | None:
        return BASE_ADAPTER if takes_adapters(self.engine.model) else None

    def _cap(self, drafts, live: list[Ticket]) -> int | None:
        if self.relative_cost is None or len(live) < self.settings.cap_from_rows:
            self.last_cap = None
            return None
        row_drafts = [
            RowDraft(
                d.tree.depths,
                len(d.aux) if d.aux else 0,
                tuple(t.state.drafted_by_depth),
                tuple(t.state.accepted_by_depth),
                t.load_aware,
            )
            for t, d in zip(live, drafts, strict=True)
        ]
        self.last_cap = choose_cap(row_drafts, self.relative_cost)
        return self.last_cap

    def _leave(self, tickets: list[Ticket]) -> None:
        """Take finished or cancelled rows out of the batch (their slots are reused, or reclaimed
        by a compaction when enough are free) and free them."""
        for t in tickets:
            self.kv.release(t.row)
            self.slots[t.row] = None
            self._release(t)
        if self.kv.needs_compaction():
            self._compact()

    def _compact(self) -> None:
        keep = [row for row, t in enumerate(self.slots) if t is not None]
        self.kv.compact(keep)
        self.slots = [self.slots[row] for row in keep]
        for row, t in enumerate(self.slots):
            t.row = row
