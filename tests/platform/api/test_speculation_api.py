"""Per-request speculation (`speculation` in the body) through the official `openai` SDK and plain
HTTP on the in-process gateway (a real tiny model service and its engine loop): every value a
variant allows answers exactly what the policy's choice answers (greedy and seeded sampling, text
and tokens), the `specserve` object names the asked strategy and says the request asked for it;
an unknown value, or a drafter strategy on a variant without a drafter, is a 400 naming
`speculation` and listing the valid values; the OpenAPI schema documents the field."""

from __future__ import annotations

import copy
import json

import openai
import pytest
from fastapi.testclient import TestClient
from word_tokenizer import WordTokenizer

from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.variants import PoolBook
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
PROMPT = "w5 w9 w14 w3 w5 w9 w14 w7 w5 w9 w14 w3 w5"
MESSAGES = [{"role": "user", "content": PROMPT}]
ASKED = {"off": "ar", "prompt_lookup": "prompt_lookup", "lookahead": "lookahead"}
VALID = "valid values: off, ar, hybrid, lookahead, prompt_lookup"  # the base model has no drafter


@pytest.fixture
def served(tiny_llama, adapter_root):
    """(SDK client, HTTP client) over one in-process gateway and model service."""
    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    loaded = LoadedModel(base, WordTokenizer(), BASE, None, None, frozenset())
    adapters = ResidentAdapters(base, [BASE], AdapterLimits(root=adapter_root))
    service = ModelService(loaded, adapters, PoolBook(), PolicySettings())
    settings = PlatformSettings(models=[BASE], max_tokens=64)
    gateway = Gateway(settings, Registry(MemoryStore()), LocalBackend({BASE: service}), Metrics())
    with TestClient(create_app(gateway)) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http), http
    service.stop()


def _chat(sdk, speculation=None, **kw):
    args = {"model": BASE, "messages": MESSAGES, "max_tokens": 24, "logprobs": True} | kw
    extra = {} if speculation is None else {"speculation": speculation}
    return sdk.chat.completions.create(extra_body=extra, **args)


def _answer(reply) -> tuple[str, list[int]]:
    """The reply's text and token ids (the word tokenizer's token `wN` is id N)."""
    choice = reply.choices[0]
    return choice.message.content, [int(t.token[1:]) for t in choice.logprobs.content]


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0}, {"temperature": 0.9, "top_p": 0.95, "seed": 11}]
)
def test_every_asked_strategy_answers_what_the_policy_answers(served, sampling):
    sdk, _ = served
    plain = _chat(sdk, **sampling)
    text, ids = _answer(plain)
    assert text and len(ids) == plain.usage.completion_tokens
    assert plain.specserve["strategy"] == "lookahead"  # the policy's choice for the base model
    assert "requested" not in plain.specserve["reason"]
    for asked, strategy in ASKED.items():
        reply = _chat(sdk, asked, **sampling)
        assert _answer(reply) == (text, ids), asked
        assert reply.specserve["strategy"] == strategy
        assert reply.specserve["reason"].startswith(
            f"requested by the request: speculation={asked}"
        )


def test_asked_strategy_streams_the_same_text_and_names_itself(served):
    sdk, _ = served
    text, _ = _answer(_chat(sdk, temperature=0))
    chunks = list(_chat(sdk, "prompt_lookup", temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    info = chunks[-1].specserve
    assert info["strategy"] == "prompt_lookup" and "speculation=prompt_lookup" in info["reason"]


def test_completions_take_it_too(served):
    _, http = served
    body = {"model": BASE, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
    plain = http.post("/v1/completions", json=body).json()
    off = http.post("/v1/completions", json=body | {"speculation": "off"}).json()
    assert off["choices"][0]["text"] == plain["choices"][0]["text"]
    assert off["specserve"]["strategy"] == "ar"
    assert off["specserve"]["reason"] == "requested by the request: speculation=off"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("turbo", "'turbo' is unknown"),
        ("eagle", "'eagle' needs a trained eagle drafter"),
        ("medusa", "'medusa' needs a trained medusa drafter"),
    ],
)
def test_unknown_or_not_allowed_values_are_a_400_listing_the_valid_ones(served, value, why):
    sdk, http = served
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(sdk, value)
    error = caught.value.body
    assert error["param"] == "speculation" and error["code"] == "invalid_value"
    assert why in error["message"] and VALID in error["message"]
    body = {"model": BASE, "prompt": PROMPT, "max_tokens": 4, "speculation": value}
    reply = http.post("/v1/completions", json=body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "speculation"
    assert VALID in reply.json()["error"]["message"]
    wrong_type = http.post("/v1/completions", json=body | {"speculation": 3})
    assert wrong_type.status_code == 400 and wrong_type.json()["error"]["param"] == "speculation"


def test_the_openapi_schema_documents_the_field(served):
    _, http = served
    schemas = json.loads(http.get("/openapi.json").text)["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        field = schemas[name]["properties"]["speculation"]
        assert "off" in field["description"] and "400" in field["description"]
