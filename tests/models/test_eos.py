"""Tests for specserve.models.eos: every form a config gives eos ids in reads as a list."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from specserve.models.eos import eos_ids, id_list


def test_id_list_reads_every_config_form():
    assert id_list(None) == [] and id_list(2) == [2]
    assert id_list([2, None, 5]) == [2, 5] and sorted(id_list({3, 4})) == [3, 4]
    assert id_list(torch.tensor([[7, 8]])) == [7, 8]
    assert id_list("2") == []


def test_eos_ids_unites_generation_config_model_config_and_tokenizer():
    model = SimpleNamespace(
        generation_config=SimpleNamespace(eos_token_id=[1, 2]),
        config=SimpleNamespace(eos_token_id=3),
    )
    assert eos_ids(model, SimpleNamespace(eos_token_id=4)) == {1, 2, 3, 4}
    bare = SimpleNamespace(config=SimpleNamespace())
    assert eos_ids(bare, SimpleNamespace()) == frozenset()
