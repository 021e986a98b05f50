"""Policy settings name drafter kinds from the torch-free kind names (the same as the engine's
registry); unknown kinds fail listing the valid ones (tests/test_layering.py keeps them light)."""

from __future__ import annotations

import pytest

from specserve.engine.drafters.kinds import DRAFTER_KINDS
from specserve.engine.drafters.specs import KIND_NAMES
from specserve.policies.settings import PolicySettings


def test_default_drafter_kinds_are_every_registered_kind():
    assert PolicySettings().drafter_kinds == list(KIND_NAMES) == DRAFTER_KINDS.names()
    assert PolicySettings().train_kind in KIND_NAMES


@pytest.mark.parametrize(
    "fields", [{"train_kind": "lora"}, {"drafter_kinds": ["eagle", "lora"], "train_kind": "eagle"}]
)
def test_an_unknown_kind_is_refused_listing_the_valid_ones(fields):
    with pytest.raises(ValueError, match="Input should be 'eagle' or 'medusa'"):
        PolicySettings(**fields)


def test_train_kind_must_be_one_the_policy_may_pick():
    with pytest.raises(ValueError, match="must be one of drafter_kinds"):
        PolicySettings(train_kind="eagle", drafter_kinds=["medusa"])
