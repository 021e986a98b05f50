"""The device cost curve: wall time of one verify forward scoring k tokens over a fixed context.

Measured once per (model, device, dtype) and cached as JSON; `relative(k)` interpolates
cost(k) / cost(1), which the tuner uses to turn acceptance into expected speed.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from pydantic import BaseModel

from specserve.engine import kv_cache
from specserve.engine.forward import verify_forward
from specserve.engine.tree import Draft, DraftTree

DEFAULT_SIZES = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class CostCurve(BaseModel):
    model_id: str
    device: str
    dtype: str
    context: int
    ms: dict[int, float]  # median milliseconds per forward of k tokens

    def relative(self, k: float) -> float:
        """cost(k) / cost(1), linear between measured sizes, flat-extrapolated past the ends.

        Example: ms {1: 100, 8: 150} gives relative(1) = 1.0, relative(4.5) = 1.25.
        """
        sizes = sorted(self.ms)
        base = self.ms[sizes[0]]
        if k <= sizes[0]:
            return 1.0
        for lo, hi in zip(sizes, sizes[1:]):
            if k <= hi:
                frac = (k - lo) / (hi - lo)
                return (self.ms[lo] + frac * (self.ms[hi] - self.ms[lo])) / base
        return self.ms[sizes[-1]] / base * k / sizes[-1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_cost_curve(
    model, model_id: str, sizes=DEFAULT_SIZES, context: int = 200, repeats: int = 5
) -> CostCurve:
    """Time verify forwards of a k-node chain after a `context`-token prefill (median of repeats)."""
    vocab = model.config.vocab_size
    prefix = [(7 * i + 3) % vocab for i in range(context)]
    ms: dict[int, float] = {}
    for k in sizes:
        chain = DraftTree(tuple(prefix[: k - 1]), tuple(range(-1, k - 2)))
        times = []
        for _ in range(repeats + 1):  # the first run warms up
            cache = kv_cache.new_cache(model.config)
            verify_forward(model, cache, 0, prefix[:-1], Draft())
            _sync(model.device)
            start = time.perf_counter()
            verify_forward(model, cache, context - 1, prefix[-1:], Draft(chain))
            _sync(model.device)
            times.append(time.perf_counter() - start)
        ms[k] = round(statistics.median(times[1:]) * 1000, 3)
    return CostCurve(
        model_id=model_id, device=str(model.device), dtype=str(model.dtype), context=context, ms=ms
    )


def cache_stem(model_id: str, device, dtype) -> str:
    """A file-name-safe key for per-(model, device, dtype) caches."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{model_id}-{device}-{dtype}")


def cost_curve_path(cache_dir: Path, model_id: str, device, dtype) -> Path:
    return Path(cache_dir) / "costs" / f"{cache_stem(model_id, device, dtype)}.json"


def load_or_measure(model, model_id: str, cache_dir: Path, remeasure: bool = False) -> CostCurve:
    """The cached curve for this model and device, measuring (and caching) it if absent."""
    path = cost_curve_path(cache_dir, model_id, model.device, model.dtype)
    if path.exists() and not remeasure:
        return CostCurve.model_validate(json.loads(path.read_text()))
    curve = measure_cost_curve(model, model_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(curve.model_dump_json(indent=1))
    return curve
