"""Fault injection for the fault suite (`specserve faults`), off unless SPECSERVE_FAULT_INJECTION=1:
`inject(service, kind)` kills or hangs a model server's engine loop thread, as a bug or a stuck
kernel would, so health checks and replacement can be measured against the real thing."""

from __future__ import annotations

import ctypes
import threading
from typing import Literal

from pydantic import BaseModel, ConfigDict

FaultKind = Literal["kill_engine_loop", "hang_engine_loop"]


class FaultRequest(BaseModel):
    """POST /admin/faults: which base model's replica (one Serve picks) and what to break."""

    model_config = ConfigDict(extra="forbid")

    model: str
    kind: FaultKind


class _EngineLoopKilled(BaseException):
    """Raised inside the engine loop thread; not an Exception, so the loop's step handler lets it
    through and the thread ends, as an uncaught bug would end it."""


def inject(service, kind: FaultKind, release: threading.Event | None = None) -> str:
    """Break `service`'s engine loop now; returns what was done. A hang lasts until `release` is
    set (None: for good; Serve replaces the replica). Raises RuntimeError if the loop is not
    running (nothing to break)."""
    thread = service.scheduler._thread
    if thread is None or not thread.is_alive():
        raise RuntimeError("the engine loop is not running")
    if kind == "kill_engine_loop":
        # the exception is raised in the thread at its next Python bytecode (after a forward)
        hit = ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(_EngineLoopKilled)
        )
        if hit != 1:
            raise RuntimeError(f"could not signal the engine loop thread ({hit})")
        service.scheduler.call(lambda: None)  # wake an idle loop so it meets the exception
        return "engine loop thread killed"
    service.scheduler.call((release or threading.Event()).wait)  # blocks between steps

    return "engine loop hung"
