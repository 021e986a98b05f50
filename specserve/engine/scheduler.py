"""Continuous batching: one loop steps every admitted request of one model together.

Each iteration drops cancelled requests, admits waiting ones (round-robin over tenants, within
the batch and KV-token budgets), prefills within a token budget, then one forward over every
decoding row (mixed adapters and strategies; drafts cut by load for load-aware rows) and commits
each row on its own. Events go to each request's sink; `run` drives it on a thread.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from specserve.engine import hf_internals
from specserve.engine.batch_cache import BatchKV
from specserve.engine.batch_forward import BatchRow, verify_batch_forward
from specserve.engine.batch_settings import BatchSettings
from specserve.engine.batch_stats import BatchStats
from specserve.engine.decode import Engine, RequestState, feature_layers
from specserve.engine.loop import EngineLoop
from specserve.engine.lora import BASE_ADAPTER
from specserve.engine.lora_batch import takes_adapters
from specserve.engine.prefix_share import can_share, share_prefill
from specserve.engine.spec_budget import RowDraft, choose_cap
from specserve.engine.tickets import EngineDead, Heartbeat, QueueFull, Ticket
from specserve.engine.tree import Draft, cap_draft

__all__ = ["BatchSettings", "EngineDead", "Heartbeat", "QueueFull", "Scheduler", "Ticket"]
log = logging.getLogger(__name__)


class Scheduler(EngineLoop):
    """The batching policy over one engine; the loop thread itself is `EngineLoop`'s."""

    def __init__(
        self,
        engine: Engine,
        settings: BatchSettings | None = None,
        relative_cost: Callable[[int], float] | None = None,
    ) -> None:
        """`relative_cost(k)`: the device cost of a k-token forward vs 1 token (cost curve); None
        never cuts drafts."""
        self.engine = engine
        self.settings = settings or BatchSettings()
        super().__init__(self.settings.niceness)
        self.relative_cost = relative_cost
        self.kv = BatchKV(engine.model.config, pack=hf_internals.is_invariant(engine.model))
        hf_internals.enable_row_attention(engine.model)  # each row attends its own columns only
        self.waiting: OrderedDict[str, deque[Ticket]] = OrderedDict()
        self.prefilling: deque[Ticket] = deque()
        self.slots: list[Ticket | None] = []  # slots[i] holds batch row i (None: a free row)
        self.reserved = 0
        self.steps = 0
        self.totals = {  # since start: where the loop's time went (replica figures)
            "decode_steps": 0,
            "decode_rows": 0,
            "decode_seconds": 0.0,
            "prefill_tokens": 0,
            "shared_prefill_tokens": 0,  # prompt tokens n choices did not compute again
            "prefill_seconds": 0.0,
            "calls_seconds": 0.0,  # model changes run between steps (adapter hand-overs)
        }
        # the decoding rows' wait per token: calls run before a step + the decode forward
        self.recent_token_gaps: deque[float] = deque(maxlen=4096)
        self._calls_before = 0.0
        self.last_cap: int | None = None
        self._ids = itertools.count(1)
        self._open: dict[int, Ticket] = {}  # submitted, not finished (wherever they are)

    # --- called from any thread ---

    def submit_group(
        self, states: list[RequestState], tenant: str, load_aware: bool, sinks: list
    ) -> list[Ticket]:
        """Queue requests with one prompt (n choices) that share one prefill (prefix_share.py):
        one queue entry, admitted together; each ticket may be cancelled on its own."""
        if len(states) > self.settings.max_batch:
            raise ValueError(f"n={len(states)} exceeds the batch of {self.settings.max_batch}")
        if not all(can_share(states[0], s) for s in states[1:]):
            raise ValueError("submit_group: the requests must share prompt and adapter")
        leader = self.submit(states[0], tenant, load_aware, sinks[0], hold=True)
        followers = [
            Ticket(next(self._ids), s, tenant, load_aware, sink, 0)
            for s, sink in zip(states[1:], sinks[1:], strict=True)
        ]
        with self._lock:
            leader.followers = followers
            self._open.update((f.id, f) for f in followers)
            leader.reserve += sum(self._reserve(s) for s in states[1:])
            self._lock.notify()
        return [leader, *followers]

    def _reserve(self, state: RequestState) -> int:
        return state.prompt_len + state.params.max_new_tokens + self.settings.draft_reserve

    def submit(
        self, state: RequestState, tenant: str, load_aware: bool, sink, hold: bool = False
    ) -> Ticket:
        """Queue a started request; raises QueueFull at once when there is no room to wait.
        `hold`: do not wake the loop (submit_group completes the ticket first)."""
        reserve = self._reserve(state)
        if reserve > self.settings.kv_tokens:
            raise ValueError(
                f"request needs {reserve} KV positions; this replica holds {self.settings.kv_tokens}"
            )
        with self._lock:
            if self.dead is not None:
                raise self.dead
            queue = self.waiting.get(tenant, deque())
            if sum(map(len, self.waiting.values())) >= self.settings.max_queue:
                raise QueueFull(f"queue full: {self.settings.max_queue} requests waiting")
            if len(queue) >= self.settings.max_queue_per_tenant:
                raise QueueFull(f"queue full for {tenant}: {len(queue)} requests waiting")
            ticket = Ticket(next(self._ids), state, tenant, load_aware, sink, reserve)
            self.waiting.setdefault(tenant, queue).append(ticket)
            self._open[ticket.id] = ticket
            if not hold:
                self._lock.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Stop a request; it leaves at the next step and frees its memory."""
        with self._lock:
            ticket.cancelled = True
            self._lock.notify()

    def stats(self) -> BatchStats:
        with self._lock:
            return BatchStats(
                waiting=sum(map(len, self.waiting.values())),
                prefilling=len(self.prefilling),
                decoding=len(self.decoding),
                kv_reserved_tokens=self.reserved,
                kv_columns=self.kv.columns,
                steps=self.steps,
                **self.totals,
                draft_cap=self.last_cap,
            )

    @property
    def decoding(self) -> list[Ticket]:
        """Requests in the decode batch, in row order."""
        return [t for t in self.slots if t is not None]

    def active(self) -> int:
        return self.stats().active

    def _fail_all(self, dead: EngineDead) -> None:
        """The loop died: end every request, queued, admitted or mid-step."""
        with self._lock:
            held = list(self._open.values())
            self.waiting.clear()
        self.prefilling.clear()
        self.slots = []
        for ticket in held:
            ticket.error = dead
            self._finish(ticket)

    def _called(self, seconds: float) -> None:
        self.totals["calls_seconds"] += seconds
        self._calls_before += seconds

    def _finish(self, ticket: Ticket) -> None:
        """Tell its consumer it ended (once)."""
        with self._lock:
            if self._open.pop(ticket.id, None) is None:
                return
        ticket.sink(None, True)

    def fail_running(self, err: BaseException) -> None:
        """End every prefilling and decoding request with `err` (their state is unknown after a
        failed step) and start from an empty batch; waiting requests stay queued."""
        held = [*self.prefilling, *self.decoding]
        self.prefilling.clear()
        self.slots = []
        self.kv.compact([])
        for t in held:
            t.error = err
            self._release(t)

    # --- the loop thread ---

    def step(self) -> bool:
        """One iteration; False when there was nothing to do."""
        self._drop_cancelled()
        self._admit()
        worked = False
        rows = sum(t is not None for t in self.slots)
        if rows:
            start = time.perf_counter()
            self._decode()
            seconds = time.perf_counter() - start
            self.totals["decode_seconds"] += seconds
            self.recent_token_gaps.append(self._calls_before + seconds)
            self._calls_before = 0.0
            self.totals["decode_rows"] += rows
            self.totals["decode_steps"] += 1
            worked = True
        if self.prefilling:
            start = time.perf_counter()
            self._prefill()
            self.totals["prefill_seconds"] += time.perf_counter() - start
            worked = True
        self.steps += worked
        return worked

    def _has_work(self) -> bool:
        return bool(self.prefilling or self.decoding or any(self.waiting.values()))

    def _drop_cancelled(self) -> None:
        with self._lock:
            for tenant, queue in list(self.waiting.items()):
                for t in [t for t in queue if t.cancelled]:
                    heir = self._promote(t)
                    queue.remove(t)
                    if heir is not None:
                        queue.appendleft(heir)
                    self._finish(t)
            for t in [t for t in self.prefilling if t.cancelled]:
                heir = self._promote(t)
                if heir is not None:
                    self.prefilling.insert(self.prefilling.index(t), heir)
                self.prefilling.remove(t)
                self._release(t)
        if any(t.cancelled for t in self.decoding):
            self._leave([t for t in self.decoding if t.cancelled])

    def _admit(self) -> None:
        """Round-robin over tenants with waiting requests while the batch and KV budget allow."""
        with self._lock:
            while True:
                used = sum(t.width for t in self.prefilling) + len(self.decoding)
                ready = [q for q in self.waiting.values() if q]
                room = self.settings.kv_tokens - self.reserved
                head = next(
                    (
                        q
                        for q in ready
                        if q[0].reserve <= room and used + q[0].width <= self.settings.max_batch
                    ),
                    None,
                )
                if head is None:
                    return
                ticket = head.popleft()
                self.waiting.move_to_end(ticket.tenant)  # this tenant goes to the back
                self.reserved += ticket.reserve
                self.prefilling.append(ticket)

    def _prefill(self) -> None:
        """Prefill admitted requests, oldest first, up to `prefill_chunk` prompt tokens in all
        (the bound on how long running decodes wait); a longer prompt goes in chunks."""
        budget = max(self.settings.prefill_chunk, self.engine.min_prefill)
        while self.prefilling and budget > 0:
            ticket = self.prefilling[0]
            state = ticket.state
            if ticket.followers:  # n choices: prefill all but the last token, then share it
                budget = self._share_prefill(ticket, budget)
                if ticket.followers or budget == 0:
                    return
            if len(state.pending) > budget:
                chunk = self.engine.prefill_size(state, budget)
                if chunk:
                    self.engine.prefill_chunk(state, chunk)
                    self.totals["prefill_tokens"] += chunk
                return
            budget -= len(state.pending)
            self.totals["prefill_tokens"] += len(state.pending)
            step = self.engine.step(state)  # the last chunk verifies the first draft as well
            self.prefilling.popleft()
            ticket.sink(step, False)
            if state.done:
                self._release(ticket)
                continue
            ticket.row = self.kv.add(state.cache, hf_internals.cache_length(state.cache))
            state.cache = None  # the batch cache holds its positions now
            if ticket.row == len(self.slots):
                self.slots.append(ticket)
            else:
                self.slots[ticket.row] = ticket

    def _share_prefill(self, leader: Ticket, budget: int) -> int:
        """Prefill the leader to its last prompt token (within `budget`), then hand the cache to
        its live followers, queued right behind it for their one-token step; the budget left."""
        state = leader.state
        if len(state.pending) > 1:
            chunk = min(budget, len(state.pending) - 1)
            if chunk < len(state.pending) - 1:  # not the last: it ends on a tile boundary
                chunk = self.engine.prefill_size(state, chunk)
                if chunk == 0:
                    return budget
            self.engine.prefill_chunk(state, chunk)
            self.totals["prefill_tokens"] += chunk
            budget -= chunk
            if len(state.pending) > 1:
                return budget
        for follower in reversed(leader.followers):
            if follower.cancelled:
                self._finish(follower)
                continue
            self.totals["shared_prefill_tokens"] += share_prefill(state, follower.state)
            self.prefilling.insert(1, follower)
        leader.followers = []
        return budget

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

    def _promote(self, leader: Ticket) -> Ticket | None:
        """A cancelled leader's first follower leads the others (and carries their
        reservation); the leader keeps only its own."""
        if not leader.followers:
            return None
        heir, *rest = leader.followers
        heir.followers, heir.reserve = rest, leader.reserve - self._reserve(leader.state)
        leader.followers, leader.reserve = [], self._reserve(leader.state)
        return heir

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            self.reserved -= ticket.reserve
        ticket.state.cache = None
        self._finish(ticket)
        for follower in ticket.followers:  # ended before sharing its prefill: they end too
            follower.error = ticket.error
            self._finish(follower)
        ticket.followers = []
