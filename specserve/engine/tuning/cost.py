"""The device cost curve: wall time of one verify forward scoring k tokens over a fixed context,
for a chain and for a tree of k (the invariant forward gathers a tree's keys: dearer).

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
    ms: dict[int, float]  # median milliseconds per forward of k tokens (a chain)
    tree_ms: dict[int, float] = {}  # the same for a binary tree of k (k >= 3; {}: not measured)

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

    def relative_tree(self, k: int) -> float:
        """cost(tree of k) / cost(1): the cheapest measured tree that fits k (never below the
        chain of k); `relative(k)` below the narrowest tree measured or past the widest.
        Example: ms {1: 100, 4: 110, 8: 120}, tree_ms {4: 118, 8: 131} -> relative_tree(4) =
        1.18, relative_tree(2) = 1.1."""
        fits = [s for s in self.tree_ms if s >= k]
        if not fits or k < min(self.tree_ms):
            return self.relative(k)
        tree = min(self.tree_ms[s] for s in fits) / self.ms[min(self.ms)]
        return max(tree, self.relative(k))


def measure_cost_curve(
    model, model_id: str, sizes=DEFAULT_SIZES, context: int = 200, repeats: int = 7
) -> CostCurve:
    """Time verify forwards of a k-node chain, and of a k-node binary tree for k >= 3 (all k
    logits), over a `context`-token cache.

    Sizes and shapes are measured round-robin, `repeats` rounds after a warm-up round, so machine noise
    spreads over all of them; each forward's entries are cropped off again. Median per size.
    """
    vocab = model.config.vocab_size
    prefix = [(7 * i + 3) % vocab for i in range(context)]
    cache = hf_internals.new_cache(model.config, growing=hf_internals.is_invariant(model))
    verify_forward(model, cache, 0, prefix[:-1], Draft())
    drafts = [
        (k, "chain", DraftTree(tuple(prefix[: k - 1]), tuple(range(-1, k - 2)))) for k in sizes
    ]
    drafts += [(k, "tree", _binary_tree(prefix, k)) for k in sizes if k >= 3]
    times: dict[tuple[int, str], list[float]] = {(k, shape): [] for k, shape, _ in drafts}
    for _ in range(repeats + 1):
        for k, shape, tree in drafts:
            sync_device(model.device)
            start = time.perf_counter()
            verify_forward(model, cache, context - 1, prefix[-1:], Draft(tree))
            sync_device(model.device)
            times[k, shape].append(time.perf_counter() - start)
            hf_internals.keep_rows(cache, context - 1, [])
    ms = {key: round(statistics.median(t[1:]) * 1000, 3) for key, t in times.items()}
    return CostCurve(
        model_id=model_id,
        device=str(model.device),
        dtype=forward_key(model),
        context=context,
        ms={k: v for (k, shape), v in ms.items() if shape == "chain"},
        tree_ms={k: v for (k, shape), v in ms.items() if shape == "tree"},
    )


def _binary_tree(tokens: list[int], k: int) -> DraftTree:
    """k - 1 draft nodes after the pending token: node 0 follows it, node i > 0 hangs off node
    (i - 1) // 2 (two children a node: the bushiest tree a proposer sends)."""
    return DraftTree(tuple(tokens[: k - 1]), tuple((i - 1) // 2 for i in range(k - 1)))


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
        curve = CostCurve.model_validate(json.loads(path.read_text()))
        if curve.tree_ms:  # (a curve cached before trees were measured is measured again)
            return curve
    curve = measure_cost_curve(model, model_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(curve.model_dump_json(indent=1))
    return curve
