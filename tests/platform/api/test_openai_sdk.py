"""The sampling features of the API driven through the official `openai` SDK (in-process gateway,
a real tiny model service and its engine loop): seeds reproduce, n choices share one prefill
and each equals a single request with its derived seed, usage counts the prompt once, streams
interleave choices by index, penalties and logit_bias apply, logprobs come per choice, and what
is still refused raises BadRequestError naming the parameter."""

from __future__ import annotations

import copy

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


@pytest.fixture
def served(tiny_llama, adapter_root):
    """(SDK client, the model service) over one in-process gateway."""
    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    loaded = LoadedModel(base, WordTokenizer(), BASE, None, None, frozenset())
    adapters = ResidentAdapters(base, [BASE], AdapterLimits(root=adapter_root))
    service = ModelService(loaded, adapters, PoolBook(), PolicySettings())
    settings = PlatformSettings(models=[BASE], max_tokens=64)
    gateway = Gateway(settings, Registry(MemoryStore()), LocalBackend({BASE: service}), Metrics())
    with TestClient(create_app(gateway)) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http), service
    service.stop()


def _chat(sdk, **kw):
    args = {"model": BASE, "messages": MESSAGES, "max_tokens": 20} | kw
    return sdk.chat.completions.create(**args)


def test_n_choices_equal_single_requests_with_derived_seeds_and_share_one_prefill(served):
    sdk, service = served
    before = service.scheduler.stats()
    reply = _chat(sdk, n=3, temperature=0.9, seed=7)
    after = service.scheduler.stats()
    prefilled = after.prefill_tokens - before.prefill_tokens
    shared = after.shared_prefill_tokens - before.shared_prefill_tokens
    assert [c.index for c in reply.choices] == [0, 1, 2]
    prompt_tokens = reply.usage.prompt_tokens
    assert prefilled == prompt_tokens - 1 + 3 and shared == 2 * (prompt_tokens - 1)  # once
    singles = [_chat(sdk, temperature=0.9, seed=7 + i) for i in range(3)]
    for choice, single in zip(reply.choices, singles, strict=True):
        assert choice.message.content == single.choices[0].message.content
        assert choice.finish_reason == single.choices[0].finish_reason
    assert len({c.message.content for c in reply.choices}) > 1
    completion = sum(s.usage.completion_tokens for s in singles)
    assert reply.usage.completion_tokens == completion  # the prompt counted once
    assert reply.usage.total_tokens == prompt_tokens + completion


def test_one_seed_repeats_and_streams_interleave_choices_by_index(served):
    sdk, _ = served
    texts = {_chat(sdk, temperature=1.0, seed=3).choices[0].message.content for _ in range(5)}
    assert len(texts) == 1
    whole = _chat(sdk, n=2, temperature=1.0, seed=3)
    chunks = list(
        _chat(
            sdk, n=2, temperature=1.0, seed=3, stream=True, stream_options={"include_usage": True}
        )
    )
    streamed, finished = {0: "", 1: ""}, {}
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert streamed == {c.index: c.message.content for c in whole.choices}
    assert set(finished) == {0, 1} and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert streamed[0] == texts.pop()  # choice 0 is the request's own seed


def test_penalties_bias_and_logprobs_through_the_sdk(served):
    sdk, _ = served
    plain = _chat(sdk, temperature=0).choices[0].message.content
    first_word = plain.split()[0]
    banned = _chat(
        sdk, temperature=0, frequency_penalty=1.0, logit_bias={first_word[1:]: -100}
    ).choices[0]
    assert not banned.message.content.startswith(first_word)
    reply = _chat(sdk, n=2, temperature=0.8, seed=1, logprobs=True, top_logprobs=3)
    for choice in reply.choices:
        tokens = [t.token for t in choice.logprobs.content]
        assert "".join(tokens).strip() == choice.message.content.strip()
        for t in choice.logprobs.content:
            tops = [c.logprob for c in t.top_logprobs]
            assert len(tops) <= 3 and tops == sorted(tops, reverse=True)


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"n": 17}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"presence_penalty": 3}, "presence_penalty"),
    ],
)
def test_what_is_refused_raises_bad_request_naming_the_parameter(served, kw, param):
    sdk, _ = served
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(sdk, **kw)
    assert caught.value.body["param"].startswith(param)
