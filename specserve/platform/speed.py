"""What a finished request's decode cost in 1-token target forwards (the device cost curve for
each verify width, plus its drafter's own levels): the figure by which the policy compares a
variant's strategies (`Acceptance.speedup` = decode tokens / this cost, against `ar`'s 1.0).
"""

from __future__ import annotations

from specserve.engine.decode.state import GenerationResult
from specserve.engine.drafters.kinds import DRAFTER_KINDS
from specserve.engine.tuning.cost import decode_cost


def request_cost(result: GenerationResult, curve, drafter=None, level_cost: float = 0.0):
    """(decode tokens, their cost in forwards), or None without a curve or a decode step.
    Decode tokens are the output after the prefill's first one; `drafter` (its kind) says how
    many draft levels the request ran, each costing `level_cost`. Example: output of 9 tokens
    over widths [4, 4] at relative(4) 1.5, no drafter -> (8, 3.0): 2.67x `ar`."""
    if curve is None or not result.widths or len(result.output_ids) < 2:
        return None
    levels = 0
    if drafter is not None and drafter.kind in DRAFTER_KINDS.names():
        levels = DRAFTER_KINDS.get(drafter.kind).draft_levels(result.drafted_by_depth)
    cost = decode_cost(result.widths, curve.relative, levels, level_cost)
    return len(result.output_ids) - 1, cost
