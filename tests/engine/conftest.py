"""Engine fixtures shared by the exactness gates (seeded sampling, penalties, logprobs, shared
prefills): a tiny Llama with random Medusa and EAGLE drafters, so every strategy really drafts."""

from __future__ import annotations

import functools

import pytest

from specserve.engine.decode.engine import Engine
from specserve.engine.drafters.modules import EagleSpec, MedusaSpec


@pytest.fixture(scope="session")
def drafting_engine(tiny_llama, tokenizer, random_drafter):
    """Factory: drafting_engine(eagle_seed=3) -> an Engine over tiny_llama(1) with drafters."""

    @functools.cache
    def make(eagle_seed: int = 3) -> Engine:
        model = tiny_llama(1, init_range=0.1)
        spec = EagleSpec(feature_layers=(0, -1))
        drafters = {
            "medusa": random_drafter(model, MedusaSpec(heads=2, topk=4), seed=2, scale=0.1),
            "eagle": random_drafter(model, spec, seed=eagle_seed, scale=0.1),
        }
        return Engine(model, tokenizer, frozenset(), drafters=drafters)

    return make
