"""`RegistryProgress`: the tqdm-like bar a drafter job trains with, writing its progress (0..1)
through a callback at most every `interval_s`: teacher prefill (a known total) fills the first
half; training (open-ended) holds at 0.75."""

from __future__ import annotations

import time
from collections.abc import Callable


class RegistryProgress:
    def __init__(
        self, write: Callable[[float], None], total: int | None, interval_s: float = 2.0
    ) -> None:
        self.write, self.total, self.interval_s = write, total, interval_s
        self.n, self._last = 0, 0.0

    @property
    def progress(self) -> float:
        return 0.5 * min(self.n / self.total, 1.0) if self.total else 0.75

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._last < self.interval_s:
            return
        self._last = time.monotonic()
        self.write(self.progress)

    def set_postfix_str(self, text: str) -> None:
        """tqdm's API; the registry keeps no free text."""

    def close(self) -> None:
        """tqdm's API; nothing to release."""
