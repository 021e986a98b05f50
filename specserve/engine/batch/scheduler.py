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
from collections import Counter, OrderedDict, deque
from collections.abc import Callable

from specserve.engine import hf_internals
from specserve.engine.batch.admission import Admission
from specserve.engine.batch.loop import EngineLoop
from specserve.engine.batch.prefix_share import share_prefill
from specserve.engine.batch.rows import DecodeRows
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.batch.stats import BatchStats
from specserve.engine.batch.tickets import EngineDead, Ticket
from specserve.engine.decode.core import Decoder
from specserve.engine.forward.batch_cache import BatchKV

log = logging.getLogger(__name__)


class Scheduler(Admission, DecodeRows, EngineLoop):
    """The batching policy over one engine: admission (`Admission`), prefill (here), the decode
    step (`DecodeRows`); the loop thread itself is `EngineLoop`'s."""

    def __init__(
        self,
        engine: Decoder,
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
        self.claims: Counter[str] = Counter()  # places held for requests being prepared
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

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            self.reserved -= ticket.reserve
        ticket.state.cache = None
        self._finish(ticket)
        for follower in ticket.followers:  # ended before sharing its prefill: they end too
            follower.error = ticket.error
            self._finish(follower)
        ticket.followers = []
