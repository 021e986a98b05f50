"""Measured acceptance of finished requests: added up per variant@version and strategy in the
gateway, flushed to the registry by a background thread (requests never wait on the store);
figures the store refused stay for the next round. The policy reads them back as measured tau.
"""

from __future__ import annotations

import logging
import threading
import time

from specserve.adapters.variants import VariantKey
from specserve.platform.events import DoneInfo
from specserve.platform.state.records import Acceptance
from specserve.platform.state.registry import Registry
from specserve.platform.state.store import StoreError

log = logging.getLogger(__name__)


class AcceptanceRecorder:
    """Pending figures of this gateway, flushed every `every_s` once `start`ed."""

    def __init__(self, registry: Registry, every_s: float = 5.0) -> None:
        self.registry, self.every_s = registry, every_s
        self._pending: dict[tuple[VariantKey, str], Acceptance] = {}
        self._lock = threading.Lock()

    def start(self) -> AcceptanceRecorder:
        threading.Thread(target=self._loop, name="acceptance-flush", daemon=True).start()
        return self

    def record(self, info: DoneInfo, tokens: int) -> None:
        """Add the figures of one request served by a variant."""
        figures = Acceptance(
            tokens=tokens,
            forwards=info.forwards,
            drafted=sum(info.drafted_by_depth),
            accepted=sum(info.accepted_by_depth),
            costed_tokens=info.decode_tokens if info.decode_cost else 0,
            cost_milli=round(info.decode_cost * 1000) if info.decode_cost else 0,
        )
        self._add({(VariantKey(info.variant, info.version), info.strategy): figures})

    def flush(self) -> None:
        """Send the pending figures to the registry; on a store error, what was not sent stays."""
        with self._lock:
            pending, self._pending = self._pending, {}
        items = list(pending.items())
        for i, ((key, strategy), figures) in enumerate(items):
            try:
                self.registry.record_acceptance(key, strategy, **figures.model_dump())
            except StoreError as err:
                log.debug("acceptance figures kept for later: %s", err)
                self._add(dict(items[i:]))
                return

    def _add(self, figures: dict[tuple[VariantKey, str], Acceptance]) -> None:
        with self._lock:
            for key, value in figures.items():
                self._pending[key] = self._pending.get(key, Acceptance()) + value

    def _loop(self) -> None:
        while True:
            time.sleep(self.every_s)
            self.flush()
