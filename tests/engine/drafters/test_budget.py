"""Tree budgets of every drafter kind: the draft level is timed on the real module, and the
chosen tree is a valid config of the kind's strategy."""

from __future__ import annotations

import pytest

from specserve.engine.drafters.budget import drafter_config, measure_step_cost
from specserve.engine.drafters.specs import KIND_NAMES, EagleSpec, MedusaSpec
from specserve.engine.proposers import REGISTRY
from specserve.engine.tuning.cost import CostCurve

SPECS = {"medusa": MedusaSpec(heads=2, topk=3), "eagle": EagleSpec(feature_layers=(0, -1))}
CURVE = CostCurve(model_id="m", device="d", dtype="t", context=64, ms={1: 1.0, 4: 1.1, 16: 1.3})


def test_every_kind_has_a_spec_here():
    assert sorted(SPECS) == list(KIND_NAMES)


@pytest.mark.parametrize("name", KIND_NAMES)
def test_each_kind_prices_its_draft_level_and_sizes_a_valid_tree(tiny_llama, random_drafter, name):
    drafter = random_drafter(tiny_llama(0), SPECS[name])
    assert measure_step_cost(drafter, CURVE, repeats=3) > 0
    config, level_cost = drafter_config(drafter, CURVE)
    assert level_cost > 0
    assert "predicted_speedup" not in config
    assert REGISTRY.config(name, config).model_dump(exclude_unset=True) == config
