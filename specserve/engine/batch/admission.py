"""The waiting side of the scheduler (`Admission`, mixed into `Scheduler`): submitting requests
(alone or n choices sharing a prefill), cancelling, and admitting waiting ones round-robin over
tenants within the batch and KV budgets. It works on the scheduler's `waiting`, `prefilling`,
`reserved`, `claims`, `settings` and lock (`EngineLoop`), set up by `Scheduler.__init__`.
"""

from __future__ import annotations

from collections import deque

from specserve.engine.batch.prefix_share import can_share
from specserve.engine.batch.tickets import QueueFull, Ticket
from specserve.engine.decode.state import RequestState


class Admission:
    """Queueing and admission of the scheduler's requests (called from any thread but
    `_drop_cancelled` / `_admit`, which the loop thread runs)."""

    def claim(self, tenant: str) -> None:
        """Hold a place for a request still being prepared (off the loop thread), so that an
        overloaded replica refuses at once instead of after preparing: QueueFull when there is
        neither room to wait nor a free batch row. `submit(..., claimed=True)` uses it up."""
        with self._lock:
            if self.dead is not None:
                raise self.dead
            self._check_room(tenant, free_rows=self._free_rows())
            self.claims[tenant] += 1

    def unclaim(self, tenant: str) -> None:
        """Give back a claim whose request was never submitted (its preparation failed)."""
        with self._lock:
            self._drop_claim(tenant)

    def _drop_claim(self, tenant: str) -> None:
        self.claims[tenant] -= 1
        if self.claims[tenant] <= 0:
            del self.claims[tenant]

    def _free_rows(self) -> int:
        used = sum(t.width for t in self.prefilling) + len(self.decoding)
        return max(0, self.settings.max_batch - used)

    def _check_room(self, tenant: str, free_rows: int = 0) -> None:
        """Under the lock: QueueFull unless one more request fits (claims count as waiting)."""
        waiting = sum(map(len, self.waiting.values())) + sum(self.claims.values())
        if waiting >= self.settings.max_queue + free_rows:
            raise QueueFull(f"queue full: {self.settings.max_queue} requests waiting")
        mine = len(self.waiting.get(tenant, ())) + self.claims[tenant]
        if mine >= self.settings.max_queue_per_tenant + free_rows:
            raise QueueFull(f"queue full for {tenant}: {mine} requests waiting")

    def submit_group(
        self,
        states: list[RequestState],
        tenant: str,
        load_aware: bool,
        sinks: list,
        claimed: bool = False,
    ) -> list[Ticket]:
        """Queue requests with one prompt (n choices) that share one prefill (prefix_share.py):
        one queue entry, admitted together; each ticket may be cancelled on its own."""
        problem = None
        if len(states) > self.settings.max_batch:
            problem = f"n={len(states)} exceeds the batch of {self.settings.max_batch}"
        elif not all(can_share(states[0], s) for s in states[1:]):
            problem = "submit_group: the requests must share prompt and adapter"
        if problem is not None:
            if claimed:
                self.unclaim(tenant)
            raise ValueError(problem)
        leader = self.submit(states[0], tenant, load_aware, sinks[0], hold=True, claimed=claimed)
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
        self,
        state: RequestState,
        tenant: str,
        load_aware: bool,
        sink,
        hold: bool = False,
        claimed: bool = False,
    ) -> Ticket:
        """Queue a started request; raises QueueFull at once when there is no room to wait.
        `hold`: do not wake the loop (submit_group completes the ticket first); `claimed`: the
        caller holds a `claim` for it, used up here whatever the outcome."""
        reserve = self._reserve(state)
        with self._lock:
            if claimed:
                self._drop_claim(tenant)
            if reserve > self.settings.kv_tokens:
                raise ValueError(
                    f"request needs {reserve} KV positions; "
                    f"this replica holds {self.settings.kv_tokens}"
                )
            if self.dead is not None:
                raise self.dead
            if not claimed:
                self._check_room(tenant)
            queue = self.waiting.get(tenant, deque())
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

    def _promote(self, leader: Ticket) -> Ticket | None:
        """A cancelled leader's first follower leads the others (and carries their
        reservation); the leader keeps only its own."""
        if not leader.followers:
            return None
        heir, *rest = leader.followers
        heir.followers, heir.reserve = rest, leader.reserve - self._reserve(leader.state)
        leader.followers, leader.reserve = [], self._reserve(leader.state)
        return heir
