"""The OpenAI request models: their sampling fields are the engine's rules (one definition, the
same bounds in the request's schema and in `SamplingParams`'), and `to_sampling()` carries every
field over to the engine."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from specserve.engine.sampling import MAX_CHOICES, SamplingParams
from specserve.platform.api.openai_api import ChatCompletionRequest, CompletionRequest
from specserve.platform.requests import GenerateRequest

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TEXT = {"model": "m", "prompt": "hi"}
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "maxProperties")


def _bounds(schema: dict) -> dict:
    """The numeric bounds of a field's JSON schema (an optional field's non-null branch)."""
    branches = schema.get("anyOf", [schema])
    for branch in branches:
        found = {k: v for k, v in branch.items() if k in BOUNDS}
        if "additionalProperties" in branch:
            found |= {f"value {k}": v for k, v in _bounds(branch["additionalProperties"]).items()}
        if found:
            return found
    return {}


@pytest.mark.parametrize("model", [CompletionRequest, ChatCompletionRequest])
@pytest.mark.parametrize(
    "field",
    ["top_p", "top_k", "presence_penalty", "frequency_penalty", "logit_bias", "max_tokens"],
)
def test_the_request_has_the_engines_bounds(model, field):
    engine = SamplingParams.model_json_schema()["properties"]
    request = model.model_json_schema()["properties"]
    engine_field = "max_new_tokens" if field == "max_tokens" else field
    assert _bounds(request[field]) == _bounds(engine[engine_field]) != {}


def test_openai_narrows_the_engines_temperature_and_legacy_logprobs():
    engine = SamplingParams.model_json_schema()["properties"]
    chat = ChatCompletionRequest.model_json_schema()["properties"]
    text = CompletionRequest.model_json_schema()["properties"]
    assert _bounds(engine["temperature"]) == {"minimum": 0.0}
    assert _bounds(chat["temperature"]) == {"minimum": 0.0, "maximum": 2.0}
    assert (
        _bounds(chat["top_logprobs"])
        == _bounds(engine["logprobs"])
        == {"minimum": 0, "maximum": 20}
    )
    assert _bounds(text["logprobs"]) == {"minimum": 0, "maximum": 5}


def test_n_is_one_rule_for_the_request_and_the_engine_request():
    assert CompletionRequest.model_validate(TEXT | {"n": MAX_CHOICES}).n == MAX_CHOICES
    with pytest.raises(ValidationError, match="n"):
        CompletionRequest.model_validate(TEXT | {"n": MAX_CHOICES + 1})
    generate = GenerateRequest.model_json_schema()["properties"]["n"]
    assert generate["maximum"] == MAX_CHOICES and generate["minimum"] == 1


def test_to_sampling_carries_every_field():
    body = TEXT | {
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 4,
        "seed": 11,
        "stop": "\n",
        "ignore_eos": True,
        "presence_penalty": 0.5,
        "frequency_penalty": -1.0,
        "logit_bias": {"5": -100, "9": 2.5},
        "logprobs": 3,
    }
    params = CompletionRequest.model_validate_json(json.dumps(body)).to_sampling(16)
    assert params == SamplingParams(
        max_new_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=4,
        seed=11,
        stop=["\n"],
        ignore_eos=True,
        presence_penalty=0.5,
        frequency_penalty=-1.0,
        logit_bias={5: -100.0, 9: 2.5},
        logprobs=3,
    )


def test_to_sampling_defaults():
    chat = ChatCompletionRequest.model_validate(CHAT).to_sampling(16)
    assert chat == SamplingParams(max_new_tokens=16, temperature=1.0)
    asked = ChatCompletionRequest.model_validate(
        CHAT | {"logprobs": True, "max_completion_tokens": 3}
    )
    assert asked.to_sampling(16).logprobs == 0 and asked.to_sampling(16).max_new_tokens == 3
    top = ChatCompletionRequest.model_validate(CHAT | {"logprobs": True, "top_logprobs": 4})
    assert top.to_sampling(16).logprobs == 4


@pytest.mark.parametrize(
    "bias",
    [{"w5": 1}, {"-1": 1}, {"5": 101}, {"5": -100.5}, {str(i): 1 for i in range(301)}, 3],
)
def test_a_bad_logit_bias_names_the_whole_field(bias):
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate(TEXT | {"logit_bias": bias})
    assert [e["loc"] for e in info.value.errors()] == [("logit_bias",)]
