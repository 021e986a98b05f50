"""Seeds and penalties over HTTP (in-process gateway, a real tiny model service and its engine
loop): five requests with one seed answer the same text while other requests decode beside them,
whatever strategy the policy picks; penalties and logit_bias reach the engine and bite; bad
values answer 400 naming the field."""

from __future__ import annotations

import copy
import threading

import pytest
from fastapi.testclient import TestClient
from word_tokenizer import WordTokenizer

from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.variants import PoolBook
from specserve.engine.decode.engine import Engine
from specserve.engine.sampling import SamplingParams
from specserve.models.load import LoadedModel
from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.backend import LocalBackend
from specserve.platform.service import ModelService
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.registry import Registry
from specserve.policies.settings import PolicySettings

BASE = "tiny-llama"
PROMPT = "w5 w9 w14 w3 w5 w9 w14 w7 w5 w9 w14 w3 w5 w9"


@pytest.fixture
def served(tiny_llama, adapter_root):
    """(client, the model): the gateway over one in-process service (lookahead by the policy)."""
    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    loaded = LoadedModel(base, WordTokenizer(), BASE, None, None, frozenset())
    adapters = ResidentAdapters(base, [BASE], AdapterLimits(root=adapter_root))
    service = ModelService(loaded, adapters, PoolBook(), PolicySettings()).start()
    settings = PlatformSettings(models=[BASE], max_tokens=64)
    gateway = Gateway(settings, Registry(MemoryStore()), LocalBackend({BASE: service}), Metrics())
    yield TestClient(create_app(gateway)), base
    service.stop()


def _completion(client, **body):
    request = {"model": BASE, "prompt": PROMPT, "max_tokens": 24} | body
    return client.post("/v1/completions", json=request)


def test_one_seed_gives_one_answer_while_other_requests_run(served):
    client, _ = served
    answers, others = [], []

    def other(i):
        reply = _completion(client, temperature=1.0, seed=1000 + i, max_tokens=40)
        others.append(reply.status_code)

    for round_ in range(5):
        crowd = [threading.Thread(target=other, args=(round_ * 3 + i,)) for i in range(3)]
        for t in crowd:
            t.start()
        reply = _completion(client, temperature=0.9, top_p=0.95, seed=42)
        assert reply.status_code == 200, reply.text
        answers.append(reply.json()["choices"][0]["text"])
        for t in crowd:
            t.join()
    assert len(set(answers)) == 1 and answers[0]
    assert others == [200] * 15
    unseeded = {_completion(client, temperature=0.9).json()["choices"][0]["text"] for _ in range(4)}
    assert len(unseeded) > 1  # without a seed, samples differ


def test_penalties_and_logit_bias_reach_the_engine(served):
    client, model = served
    ids = [int(w[1:]) for w in PROMPT.split()]
    engine = Engine(model, WordTokenizer(), frozenset())
    plain = engine.generate(ids, SamplingParams(max_new_tokens=24)).output_ids
    banned = plain[0]
    params = SamplingParams(
        max_new_tokens=24, frequency_penalty=1.5, presence_penalty=0.5, logit_bias={banned: -100}
    )
    want = engine.generate(ids, params).text
    reply = _completion(
        client,
        temperature=0,
        frequency_penalty=1.5,
        presence_penalty=0.5,
        logit_bias={str(banned): -100},
    )
    assert reply.status_code == 200, reply.text
    text = reply.json()["choices"][0]["text"]
    assert text == want and f"w{banned} " not in f"{text} "
    assert engine.generate(ids, params).output_ids != plain


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"logit_bias": {"w5": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
    ],
)
def test_bad_penalties_answer_400_naming_the_field(served, body, param):
    client, _ = served
    reply = _completion(client, **body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param


def test_a_bias_outside_the_vocabulary_answers_400(served):
    client, _ = served
    reply = _completion(client, logit_bias={"100000": 1})
    assert reply.status_code == 400 and "logit_bias" in reply.json()["error"]["message"]
