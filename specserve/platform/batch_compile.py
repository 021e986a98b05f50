"""A replica's compiled batched forward, warmed in the background: `start` decides from the
`compile` setting and the cached measurement, pins the LoRA modules on the engine thread, then
compiles and measures in a thread of its own while the loop serves eager; steps route to the
compiled forward once it is warm. `state` is what health and stats report. Light to import (no
torch): replica stats (`CompileState`) and the Serve app builder import it.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

log = logging.getLogger("specserve.compile")


class CompileState(BaseModel):
    """Where the replica's compiled batched forward stands."""

    status: Literal["off", "warming", "ready", "failed"]
    reason: str
    start_s: float | None = None  # the warm-up's compile + measure time, once ready
    gain: float | None = None  # eager / compiled batched step, as measured by the warm-up


class BatchCompile:
    """The background warm-up of one service's batched forward."""

    def __init__(self) -> None:
        self.state = CompileState(status="off", reason="compile off")
        self._thread: threading.Thread | None = None

    def start(self, service, mode: str, model_id: str, cache_dir: Path) -> BatchCompile:
        """Decide (`compile_choice.decide` over the cached batched record), and if on, attach on
        the engine thread and warm in the background; never blocks for the compile."""
        from specserve.engine.tuning import compile_choice  # lazy: torch (~5 s); see the docstring

        # compiled graphs persist beside the other caches: a later start loads them from disk
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(cache_dir) / "inductor"))
        model = service.engine.model
        record = compile_choice.cached_record(
            cache_dir, model_id, model.device, model.dtype, batched=True
        )
        decision = compile_choice.decide(mode, record, model.dtype)
        log.info("%s: batched forward compile %s", model_id, decision.reason)
        if not decision.enabled:
            self.state = CompileState(status="off", reason=decision.reason)
            return self
        self.state = CompileState(status="warming", reason=decision.reason)
        self._thread = threading.Thread(
            target=self._warm,
            args=(service, model_id, cache_dir),
            name="batch-compile",
            daemon=True,
        )
        self._thread.start()
        return self

    def _warm(self, service, model_id: str, cache_dir: Path) -> None:
        from specserve.engine.forward import compiled_batch  # lazy: torch, as above
        from specserve.engine.tuning import compile_choice  # lazy: torch, as above

        try:
            settings = compiled_batch.BatchCompileSettings()
            model = service.engine.model
            # pinning adds hooks: between steps, on the engine thread
            attach = service.scheduler.call(lambda: compiled_batch.attach_batch(model, settings))
            target = attach.result()
            record = target.warm(model_id)
            compile_choice.save_record(cache_dir, record)
        except Exception as err:  # the replica keeps serving eager; the reason is reported
            log.exception("%s: batched forward compile failed", model_id)
            self.state = CompileState(status="failed", reason=f"{type(err).__name__}: {err}")
            return
        log.info(
            "%s: compiled batched forward ready in %.0f s (%.2fx at %d rows)",
            model_id,
            record.start_s,
            record.gain,
            max(record.compiled_ms),
        )
        self.state = CompileState(
            status="ready", reason=self.state.reason, start_s=record.start_s, gain=record.gain
        )

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
