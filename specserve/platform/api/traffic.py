"""Traffic capture in the gateway: a finished request of a capturing variant is queued in memory
(bounded; the oldest is dropped when full) and a background thread writes the queue to the
registry store (state/traffic.py), so a request never waits on, or fails by, its capture.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from specserve.platform.state.records import CaptureSettings
from specserve.platform.state.registry import Registry, UnknownVariant
from specserve.platform.state.store import StoreError
from specserve.platform.state.traffic import TrafficLog, TrafficSample

log = logging.getLogger(__name__)


class TrafficRecorder:
    """Samples of this gateway waiting to be written, flushed every `every_s` once `start`ed."""

    def __init__(self, registry: Registry, every_s: float = 2.0, max_pending: int = 1000) -> None:
        self.registry, self.log, self.every_s = registry, TrafficLog(registry), every_s
        self._pending: collections.deque[tuple[str, TrafficSample]] = collections.deque(
            maxlen=max_pending
        )
        self._lock = threading.Lock()
        self.written = self.refused = self.dropped = 0  # samples, since start

    def start(self) -> TrafficRecorder:
        threading.Thread(target=self._loop, name="traffic-capture", daemon=True).start()
        return self

    def record(self, name: str, sample: TrafficSample) -> None:
        """Queue one served request of variant `name` (never blocks on the store)."""
        with self._lock:
            if len(self._pending) == self._pending.maxlen:
                self.dropped += 1
            self._pending.append((name, sample))

    def flush(self) -> None:
        """Write what is queued; each variant's settings are read once per flush. A sample the
        store refuses (variant deleted, capture off) is dropped; on a store outage the rest is
        dropped too: capture is a sample, it never holds text back for later."""
        with self._lock:
            pending, self._pending = (
                list(self._pending),
                collections.deque(maxlen=self._pending.maxlen),
            )
        settings: dict[str, CaptureSettings | None] = {}
        for i, (name, sample) in enumerate(pending):
            try:
                if name not in settings:
                    settings[name] = self._settings(name)
                found = settings[name]
                kept = found is not None and found.enabled and self.log.add(name, sample, found)
            except StoreError as err:
                log.warning("traffic capture: %d samples dropped: %s", len(pending) - i, err)
                self.dropped += len(pending) - i
                return
            if kept:
                self.written += 1
            else:
                self.refused += 1

    def _settings(self, name: str) -> CaptureSettings | None:
        try:
            return self.registry.capture(name)
        except (UnknownVariant, ValueError):
            return None

    def _loop(self) -> None:
        while True:
            time.sleep(self.every_s)
            try:
                self.flush()
            except Exception:
                log.exception("traffic capture flush failed")
