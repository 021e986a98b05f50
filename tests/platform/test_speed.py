"""A request's decode cost in 1-token forwards (`speed.request_cost`) and the registry's sum of
it (`Acceptance.speedup`), which the policy compares strategies by; the service's side is in
test_service.py."""

from __future__ import annotations

import pytest

from specserve.engine.decode.state import GenerationResult
from specserve.engine.drafters.kinds import DRAFTER_KINDS
from specserve.engine.tuning.cost import CostCurve, decode_cost
from specserve.platform.speed import request_cost
from specserve.platform.state.records import Acceptance

# relative(k) = k: a verify of k rows costs k 1-token forwards (easy to check by hand)
LINEAR = CostCurve(model_id="tiny", device="cpu", dtype="f32", context=8, ms={1: 10.0, 64: 640.0})
BUMPY = CostCurve(model_id="t", device="cpu", dtype="f32", context=8, ms={1: 10, 4: 12, 8: 20})


def _result(output: int, widths: list[int], drafted_by_depth=()) -> GenerationResult:
    return GenerationResult(
        prompt_ids=[1],
        output_ids=list(range(output)),
        text="",
        finish_reason="length",
        strategy="x",
        forwards=len(widths) + 1,
        tau=1.0,
        widths=widths,
        seconds=1.0,
        ttft_seconds=0.1,
        drafted_by_depth=list(drafted_by_depth),
    )


def test_decode_cost_worked_example():
    relative = {4: 1.2, 1: 1.0}.__getitem__
    assert decode_cost([4, 4, 1], relative, draft_levels=3, level_cost=0.1) == pytest.approx(3.7)


def test_request_cost_worked_example_and_draft_levels_by_kind():
    assert request_cost(_result(9, [4, 4]), BUMPY) == (8, pytest.approx(2.4))
    assert request_cost(_result(9, [4, 4]), None) is None  # no curve: no figure
    assert request_cost(_result(1, []), BUMPY) is None  # no decode step
    assert DRAFTER_KINDS.get("eagle").draft_levels([5, 3, 1]) == 9  # one level per depth
    assert DRAFTER_KINDS.get("medusa").draft_levels([5, 3, 1]) == 5  # one per drafting step


def test_speedup_adds_up_across_requests():
    one = Acceptance(tokens=10, forwards=5, costed_tokens=8, cost_milli=4000)
    two = Acceptance(tokens=10, forwards=5, costed_tokens=12, cost_milli=6000)
    assert (one + two).speedup == pytest.approx(2.0)
    assert Acceptance(tokens=3, forwards=3).speedup is None
