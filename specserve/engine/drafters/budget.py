"""Size a drafter's tree to the device: price the drafter's own forward against the target's
cost curve and pick the tree maximizing expected τ / step cost (each kind's `tree_config`).
"""

from __future__ import annotations

import time

import torch

from specserve.engine.drafters.artifact import Drafter
from specserve.engine.drafters.kinds import DRAFTER_KINDS
from specserve.engine.drafters.vocab import head_rows
from specserve.engine.tuning.cost import CostCurve


def tree_config(
    kind: str, acc: list[list[float]], curve: CostCurve, step_cost: float, max_size: int = 64
) -> dict:
    """Strategy config for the best tree under `curve`; step_cost: one draft level (EAGLE) or
    the heads (Medusa), relative to a 1-token target forward.

    Example: a flat curve (every width costs the same) and acc 0.8 at every depth gives a big
    tree; the 2-core CPU curve (2 rows cost 1.6x one) a small one.
    """
    return DRAFTER_KINDS.get(kind).tree_config(acc, curve, step_cost, max_size)


@torch.inference_mode()
def measure_step_cost(
    drafter: Drafter, curve: CostCurve, rows: int = 4, repeats: int = 20
) -> float:
    """Median wall time of one draft level over `rows` nodes (EAGLE: the layer + draft LM head;
    Medusa: all heads + LM head for one feature), relative to the curve's 1-token forward."""
    draft_level = DRAFTER_KINDS.get(drafter.kind).draft_level
    w = head_rows(drafter.target, drafter.draft_vocab)
    times = []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        draft_level(drafter, w, rows)
        if w.device.type == "cuda":
            torch.cuda.synchronize(w.device)
        times.append(time.perf_counter() - t0)
    times = sorted(times[2:])
    return times[len(times) // 2] * 1000 / curve.ms[min(curve.ms)]


def drafter_config(drafter: Drafter, curve: CostCurve) -> tuple[dict, float]:
    """The tree for this drafter on this device (expected τ / (verify + draft cost)) and the
    measured cost of one draft level in 1-token target forwards."""
    step = measure_step_cost(drafter, curve)
    config = tree_config(drafter.kind, drafter.manifest.accept_rates, curve, step)
    config.pop("predicted_speedup")
    return config, step
