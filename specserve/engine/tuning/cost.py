"""The device cost curve: wall time of one verify forward scoring k tokens over a fixed context.

Measured once per (model, device, dtype) and cached as JSON; `relative(k)` interpolates
cost(k) / cost(1), which the tuner uses to turn acceptance into expected speed.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from specserve.engine import hf_internals
from specserve.engine.forward.compiled import forward_key, sync_device
from specserve.engine.forward.single import verify_forward
from specserve.engine.tree import Draft, DraftTree

DEFAULT_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)


class CostCurve(BaseModel):
    model_id: str
    device: str
    dtype: str
    context: int
    ms: dict[int, float]  # median milliseconds per forward of k tokens

    def padded_width(self, k: int) -> int:
        """The cheapest measured width that fits k tokens (padding rows are free to add).

        Small-row matmuls on CPU are bumpy: with ms {1: 58, 2: 97, 4: 84, 5: 74}, k = 2 pads to 5.
        Beyond the largest measured width, k itself.
        """
        fits = [s for s in self.ms if s >= k]
        return min(fits, key=lambda s: (self.ms[s], s)) if fits else k

    def relative(self, k: int) -> float:
        """cost(padded width of k) / cost(1); linear extrapolation past the largest width.

        Example: ms {1: 100, 8: 150, 16: 160} gives relative(1) = 1.0, relative(5) = 1.5,
        relative(32) = 3.2.
        """
        base = self.ms[min(self.ms)]
        largest = max(self.ms)
        if k > largest:
            return self.ms[largest] / base * k / largest
        return self.ms[self.padded_width(k)] / base


def measure_cost_curve(
    model, model_id: str, sizes=DEFAULT_SIZES, context: int = 200, repeats: int = 7
) -> CostCurve:
    """Time verify forwards of a k-node chain (all k logits) over a `context`-token cache.

    Sizes are measured round-robin, `repeats` rounds after a warm-up round, so machine noise
    spreads over all of them; each forward's entries are cropped off again. Median per size.
    """
    vocab = model.config.vocab_size
    prefix = [(7 * i + 3) % vocab for i in range(context)]
    cache = hf_internals.new_cache(model.config, growing=hf_internals.is_invariant(model))
    verify_forward(model, cache, 0, prefix[:-1], Draft())
    times: dict[int, list[float]] = {k: [] for k in sizes}
    for _ in range(repeats + 1):
        for k in sizes:
            chain = DraftTree(tuple(prefix[: k - 1]), tuple(range(-1, k - 2)))
            sync_device(model.device)
            start = time.perf_counter()
            verify_forward(model, cache, context - 1, prefix[-1:], Draft(chain))
            sync_device(model.device)
            times[k].append(time.perf_counter() - start)
            hf_internals.keep_rows(cache, context - 1, [])
    ms = {k: round(statistics.median(t[1:]) * 1000, 3) for k, t in times.items()}
    return CostCurve(
        model_id=model_id,
        device=str(model.device),
        dtype=forward_key(model),
        context=context,
        ms=ms,
    )


def decode_cost(
    widths: list[int],
    relative: Callable[[int], float],
    draft_levels: int = 0,
    level_cost: float = 0.0,
) -> float:
    """A request's decode steps in 1-token forwards: each verify of w rows costs relative(w), each
    draft level `level_cost`. Example: widths [4, 4, 1], relative(4) 1.2, relative(1) 1.0, 3
    draft levels at 0.1 -> 1.2 + 1.2 + 1.0 + 0.3 = 3.7."""
    return sum(relative(w) for w in widths) + draft_levels * level_cost


def cache_stem(model_id: str, device, dtype) -> str:
    """A file-name-safe key for per-(model, device, dtype) caches."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{model_id}-{device}-{dtype}")


def cost_curve_path(cache_dir: Path, model_id: str, device, dtype) -> Path:
    return Path(cache_dir) / "costs" / f"{cache_stem(model_id, device, dtype)}.json"


def load_or_measure(model, model_id: str, cache_dir: Path, remeasure: bool = False) -> CostCurve:
    """The cached curve for this model and device, measuring (and caching) it if absent."""
    path = cost_curve_path(cache_dir, model_id, model.device, forward_key(model))
    if path.exists() and not remeasure:
        return CostCurve.model_validate(json.loads(path.read_text()))
    curve = measure_cost_curve(model, model_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(curve.model_dump_json(indent=1))
    return curve
