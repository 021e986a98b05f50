"""Every drafter kind has exactly one trainer, bound to the engine's entry for that kind; the
settings accept only kind names, and each trainer picks its spec and teacher layers."""

from __future__ import annotations

import pytest

from specserve.engine.drafters.kinds import DRAFTER_KINDS
from specserve.engine.drafters.specs import KIND_NAMES
from specserve.engine.proposers import REGISTRY
from specserve.training.kinds import TRAINERS
from specserve.training.settings import DrafterTrainSettings


def test_every_kind_has_a_trainer():
    assert TRAINERS.names() == DRAFTER_KINDS.names() == list(KIND_NAMES)
    for name in KIND_NAMES:
        assert TRAINERS.get(name).kind is DRAFTER_KINDS.get(name)


@pytest.mark.parametrize("name", KIND_NAMES)
def test_the_heldout_tree_is_a_config_of_the_kinds_strategy(name):
    config = TRAINERS.get(name).heldout_config
    assert REGISTRY.config(name, config).model_dump(exclude_unset=True) == config


@pytest.mark.parametrize("name", KIND_NAMES)
def test_the_trained_spec_is_of_its_kind(name):
    spec = TRAINERS.get(name).spec(DrafterTrainSettings(kind=name), 100)
    assert isinstance(spec, DRAFTER_KINDS.get(name).spec_type)


def test_an_unknown_kind_is_refused_listing_the_valid_ones():
    with pytest.raises(ValueError, match="Input should be 'eagle' or 'medusa'"):
        DrafterTrainSettings(kind="lora")


def test_own_medusa_heads_span_the_draft_vocabulary_and_eagle_learns_its_final_feature():
    medusa = TRAINERS.get("medusa")
    settings = DrafterTrainSettings(kind="medusa", medusa={"own_head": 1})
    assert medusa.spec(settings, 300).own_head == 300
    assert medusa.spec(DrafterTrainSettings(kind="medusa"), 300).own_head == 0
    assert medusa.teacher_layers(medusa.spec(settings, 300)) == (-1,)
    eagle = TRAINERS.get("eagle")
    spec = eagle.spec(DrafterTrainSettings(kind="eagle", eagle={"feature_layers": (0, 2)}), 300)
    assert eagle.teacher_layers(spec) == (0, 2, -1)
