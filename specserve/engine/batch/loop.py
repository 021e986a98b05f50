"""The engine loop thread: it steps until stopped, runs calls between steps (model changes),
beats for health checks, and should anything escape it, ends every request it held with
`EngineDead` and refuses new ones. `Scheduler` supplies the steps."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import torch

from specserve.engine.batch.tickets import EngineDead, Heartbeat, lower_priority

log = logging.getLogger(__name__)


class EngineLoop:
    """The thread and its calls; subclasses define `step`, `_has_work`, `fail_running` (a step
    failed), `_fail_all` (the thread died) and `_called(seconds)` (a call's time)."""

    def __init__(self, niceness: int = 0) -> None:
        self.niceness = niceness
        self._lock = threading.Condition()
        self._calls: deque[tuple[Callable[[], object], Future]] = deque()
        self._stop = False
        self.dead: EngineDead | None = None  # set when the loop thread died
        self._thread: threading.Thread | None = None
        self._beat = time.monotonic()  # the loop's last finished iteration (heartbeat)
        self._threads = torch.get_num_threads()  # the creator's intra-op threads, for the loop

    def call(self, fn: Callable[[], object]) -> Future:
        """Run `fn` on the loop thread between steps (model changes: loading an adapter)."""
        future: Future = Future()
        with self._lock:
            if self.dead is not None:
                future.set_exception(self.dead)
                return future
            self._calls.append((fn, future))
            self._lock.notify()
        if self._thread is None:  # not running on a thread: run now
            self._run_calls()
        return future

    def heartbeat(self) -> Heartbeat:
        """Cheap: the lock is held only between steps, never across one."""
        with self._lock:
            pending = self._has_work() or bool(self._calls)
        return Heartbeat(
            started=self._thread is not None,
            alive=self.running,
            since_beat_s=time.monotonic() - self._beat,
            pending=pending,
        )

    @property
    def running(self) -> bool:
        """False from the moment the loop is declared dead, before its thread has unwound."""
        return self.dead is None and self._thread is not None and self._thread.is_alive()

    def start(self) -> EngineLoop:
        self._thread = threading.Thread(target=self.run, name="specserve-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def run(self) -> None:
        """The loop thread. Should anything escape it (an uncaught failure, a kill), every
        request it held ends with EngineDead rather than waiting forever."""
        try:
            self._loop()
        except BaseException as err:
            self._died(err)
            raise

    def _died(self, err: BaseException) -> None:
        log.critical("engine loop thread died (%r): failing every request it held", err)
        dead = EngineDead(f"engine loop thread died: {err!r}")
        with self._lock:
            self.dead = dead
            calls = list(self._calls)
            self._calls.clear()
        self._fail_all(dead)
        for _, future in calls:
            future.set_exception(dead)

    def _loop(self) -> None:
        lower_priority(self.niceness)  # before the compute threads exist: they inherit
        # OpenMP's thread count is per thread: a new thread starts from OMP_NUM_THREADS (Ray sets
        # it to the actor's num_cpus), not from the creator's torch.set_num_threads
        torch.set_num_threads(self._threads)
        while True:
            with self._lock:
                while not self._stop and not self._calls and not self._has_work():
                    self._beat = time.monotonic()
                    self._lock.wait(timeout=1.0)
                if self._stop:
                    return
                self._beat = time.monotonic()  # woken for work: a step is due from now
            self._run_calls()
            try:
                self.step()
            except Exception as err:
                log.exception("engine step failed; failing the requests it held")
                self.fail_running(err)
            self._beat = time.monotonic()

    def _run_calls(self) -> None:
        while True:
            with self._lock:
                if not self._calls:
                    return
                fn, future = self._calls.popleft()
            started = time.perf_counter()
            self._run_call(fn, future)
            self._called(time.perf_counter() - started)

    @staticmethod
    def _run_call(fn, future: Future) -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn())
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                future.set_exception(err)
