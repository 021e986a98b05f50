"""Size a drafter's tree to the device: price the drafter's own forward against the target's
cost curve and pick the tree maximizing expected τ / step cost (`trees.choose_tree_size`).
"""

from __future__ import annotations

import time

import torch

from specserve.engine.cost import CostCurve
from specserve.engine.drafters.artifact import Drafter
from specserve.engine.drafters.modules import additive_mask
from specserve.engine.drafters.trees import choose_tree_size, greedy_tree
from specserve.engine.drafters.vocab import head_rows


def tree_config(
    kind: str, acc: list[list[float]], curve: CostCurve, step_cost: float, max_size: int = 64
) -> dict:
    """Strategy config for the best tree under `curve`; step_cost: one draft level (EAGLE) or
    the heads (Medusa), relative to a 1-token target forward.

    Example: a flat curve (every width costs the same) and acc 0.8 at every depth gives a big
    tree; the 2-core CPU curve (2 rows cost 1.6x one) a small one.
    """
    if kind == "medusa":
        size, speed = choose_tree_size(acc, curve.relative, max_size, draft_fixed_cost=step_cost)
        return {"tree_size": max(size, 1), "predicted_speedup": round(speed, 3)}
    size, speed = choose_tree_size(acc, curve.relative, max_size, draft_step_cost=step_cost)
    size = max(size, 1)
    paths = [p for p, _ in greedy_tree(acc, size)]
    depth = max(len(p) for p in paths)
    topk = min(max(2, 1 + max(r for p in paths for r in p)), 8)
    return {
        "depth": depth,
        "topk": topk,
        "total_tokens": size,
        "predicted_speedup": round(speed, 3),
    }


@torch.inference_mode()
def measure_step_cost(
    drafter: Drafter, curve: CostCurve, rows: int = 4, repeats: int = 20
) -> float:
    """Median wall time of one draft level over `rows` nodes (EAGLE: the layer + draft LM head;
    Medusa: all heads + LM head for one feature), relative to the curve's 1-token forward."""
    target = drafter.target
    hidden = target.config.hidden_size
    w = head_rows(target, drafter.draft_vocab)
    dev, dtype = w.device, w.dtype
    times = []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        if drafter.kind == "medusa":
            _ = drafter.module(torch.zeros(hidden, device=dev, dtype=dtype)) @ w.T
        else:
            q = rows
            e = torch.zeros(1, q, hidden, device=dev, dtype=dtype)
            mask = additive_mask(torch.ones(q, q, dtype=torch.bool, device=dev), dtype)[None, None]
            pos = torch.zeros(1, q, dtype=torch.long, device=dev)
            h = drafter.module(e, e, mask, pos, target, None)
            _ = torch.log_softmax((h[0] @ w.T).float(), dim=-1)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    times = sorted(times[2:])
    return times[len(times) // 2] * 1000 / curve.ms[min(curve.ms)]


def drafter_config(drafter: Drafter, curve: CostCurve) -> dict:
    """The tree for this drafter on this device: expected τ / (verify + draft cost), measured."""
    step = measure_step_cost(drafter, curve)
    config = tree_config(drafter.kind, drafter.manifest.accept_rates, curve, step)
    config.pop("predicted_speedup")
    return config
