"""What the scheduler queues and reports: a `Ticket` per submitted request (with the followers
that share its prefill), `QueueFull`, `EngineDead`, the loop's `Heartbeat`, and the loop
thread's niceness."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from specserve.engine.decode.state import RequestState, StepResult

log = logging.getLogger(__name__)


def lower_priority(niceness: int) -> None:
    """Add `niceness` to the calling thread's (Linux: per thread; threads it starts inherit it)."""
    if niceness <= 0 or not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(
            os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness)
        )
    except OSError as err:  # e.g. a sandbox without setpriority: run at the same priority
        log.warning("engine loop niceness not applied: %s", err)


class Heartbeat(BaseModel):
    """The loop thread's pulse, for health checks: whether it was started and still runs, how
    long since it last finished an iteration (a step, the calls before it, or an idle wait),
    and whether requests are waiting or running."""

    model_config = ConfigDict(frozen=True)

    started: bool
    alive: bool
    since_beat_s: float
    pending: bool


class EngineDead(RuntimeError):
    """The engine loop thread died: the requests it held were failed, and nothing submitted
    here will run again (the replica's health check fails; it must be replaced)."""


class QueueFull(RuntimeError):
    """The replica's waiting queue (or this tenant's share of it) is full: retry later."""


@dataclass
class Ticket:
    """One submitted request. `sink(step, finished)` gets every commit, then finished=True once."""

    id: int
    state: RequestState
    tenant: str
    load_aware: bool
    sink: Callable[[StepResult | None, bool], None]
    reserve: int
    cancelled: bool = False
    row: int | None = None  # its row in the decode batch
    error: BaseException | None = None  # set when a failed step ended it
    followers: list[Ticket] = field(default_factory=list)  # same prompt: share this prefill

    @property
    def width(self) -> int:
        """Batch rows it will take (itself and its followers)."""
        return 1 + len(self.followers)
