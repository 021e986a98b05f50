"""The drafter-kind registry: one entry per torch-free kind name, each drafting for the strategy of
its name; unknown kinds fail listing the valid ones."""

from __future__ import annotations

import pytest

from specserve.engine.drafters.kinds import DRAFTER_KINDS
from specserve.engine.drafters.specs import KIND_NAMES, SPEC_TYPES
from specserve.engine.proposers import REGISTRY


def test_the_registry_and_the_torch_free_names_agree():
    assert DRAFTER_KINDS.names() == list(KIND_NAMES)
    assert {DRAFTER_KINDS.get(name).spec_type for name in KIND_NAMES} == set(SPEC_TYPES)


@pytest.mark.parametrize("name", KIND_NAMES)
def test_every_kind_drafts_for_the_strategy_of_its_name(name):
    kind = DRAFTER_KINDS.get(name)
    assert kind.name == name == kind.spec_type().kind
    assert REGISTRY.get(name).name == name


def test_an_unknown_kind_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown drafter kind 'lora'; valid drafter kinds: eagle"):
        DRAFTER_KINDS.get("lora")
