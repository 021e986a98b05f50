"""`logprobs` / `top_logprobs` over HTTP as the official `openai` SDK parses them (in-process
gateway, real tiny model service): chat and completions, JSON and SSE, values equal to a plain
full forward of the model, candidates most likely first, masked tokens never listed, clear 400s."""

from __future__ import annotations

import copy

import openai
import pytest
import torch
from fastapi.testclient import TestClient
from word_tokenizer import WordTokenizer

from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.variants import PoolBook
from specserve.engine.logprobs import logprob_rows
from specserve.engine.prompts import encode_messages, encode_prompt
from specserve.engine.sampling import SamplingParams
from specserve.models.load import LoadedModel
from specserve.platform.api.gateway import Gateway
from specserve.platform.api.metrics import Metrics
from specserve.platform.api.routes import create_app
from specserve.platform.backend import LocalBackend
from specserve.platform.events import Delta, parse_event
from specserve.platform.service import ModelService
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.registry import Registry
from specserve.policies.settings import PolicySettings

BASE = "tiny-llama"
PROMPT = "w5 w9 w14 w3 w5 w9 w14 w7 w5 w9"
MESSAGES = [{"role": "user", "content": PROMPT}]
TOL = 1e-5


@pytest.fixture(scope="module")
def model(tiny_llama):
    return tiny_llama(1, init_range=0.1)


@pytest.fixture
def http(model, adapter_root):
    """A TestClient (an httpx.Client) on a gateway over one in-process tiny model service."""
    base = copy.deepcopy(model)
    loaded = LoadedModel(base, WordTokenizer(), BASE, None, None, frozenset())
    adapters = ResidentAdapters(base, [BASE], AdapterLimits(root=adapter_root))
    service = ModelService(loaded, adapters, PoolBook(), PolicySettings())
    settings = PlatformSettings(models=[BASE], max_tokens=64)
    gateway = Gateway(settings, Registry(MemoryStore()), LocalBackend({BASE: service}), Metrics())
    with TestClient(create_app(gateway)) as client:
        yield client
    service.stop()


@pytest.fixture
def sdk(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http)


def _ids(tokens: list[str]) -> list[int]:
    return [int(t.strip()[1:]) for t in tokens]  # WordTokenizer: id i is "w<i> "


def _reference(model, prompt_ids, output_ids, params) -> torch.Tensor:
    """[len(output), vocab] log-probs a plain full forward gives each output position."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + output_ids])).logits[0].float()
    start = len(prompt_ids) - 1
    return logprob_rows(logits[start : start + len(output_ids)], params)


def _check_chat_content(model, content, params, k) -> None:
    prompt_ids = encode_messages(WordTokenizer(), MESSAGES)
    output = _ids([c.token for c in content])
    want = _reference(model, prompt_ids, output, params)
    for j, c in enumerate(content):
        assert abs(c.logprob - want[j, output[j]].item()) < TOL
        assert c.bytes == list(c.token.encode())
        assert len(c.top_logprobs) == min(k, int(torch.isfinite(want[j]).sum()))
        values = [t.logprob for t in c.top_logprobs]
        assert values == sorted(values, reverse=True)
        ref = torch.topk(want[j], len(values)).values.tolist()
        assert all(abs(a - b) < TOL for a, b in zip(values, ref, strict=True))
        for t in c.top_logprobs:
            assert abs(t.logprob - want[j, _ids([t.token])[0]].item()) < TOL
            assert t.bytes == list(t.token.encode())


def _assert_same(got, want) -> None:
    assert [c.token for c in got] == [c.token for c in want]
    assert all(abs(a.logprob - b.logprob) < TOL for a, b in zip(got, want, strict=True))
    for a, b in zip(got, want, strict=True):
        assert [t.token for t in a.top_logprobs] == [t.token for t in b.top_logprobs]


def test_chat_json_and_stream_logprobs(sdk, http, model):
    body = {"model": BASE, "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    r = sdk.chat.completions.create(**body, logprobs=True, top_logprobs=4)
    choice = r.choices[0]
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens == 16
    info = r.model_extra["specserve"]
    assert info["strategy"] != "ar" and info["tau"] > 1  # speculative steps were read
    assert "".join(c.token for c in content) == choice.message.content
    assert all(c.token == c.top_logprobs[0].token for c in content)  # greedy: the argmax
    _check_chat_content(model, content, SamplingParams(), 4)

    streamed = []
    for chunk in sdk.chat.completions.create(**body, logprobs=True, top_logprobs=4, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed.extend(chunk.choices[0].logprobs.content)
    _assert_same(streamed, content)  # another draft tree: equal within float rounding

    plain = http.post("/v1/chat/completions", json=body).json()  # not asked: the wire as before
    assert set(plain["choices"][0]) == {"index", "message", "finish_reason"}
    assert plain["choices"][0]["message"]["content"] == choice.message.content
    just = sdk.chat.completions.create(**body, logprobs=True)  # no top_logprobs: empty lists
    bare = [c.model_copy(update={"top_logprobs": []}) for c in content]
    _assert_same(just.choices[0].logprobs.content, bare)


def test_sampled_chat_logprobs_are_the_processed_distribution(sdk, model):
    """temperature, top-k: the logprobs of the distribution sampled from; top_k 2 lists 2."""
    extra = {"temperature": 0.8, "top_k": 2, "seed": 7}
    body = {"model": BASE, "messages": MESSAGES, "max_tokens": 12, "extra_body": extra}
    r = sdk.chat.completions.create(**body, logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    assert len(content) == 12 and all(len(c.top_logprobs) == 2 for c in content)
    _check_chat_content(model, content, SamplingParams(temperature=0.8, top_k=2), 5)
    chunks = sdk.chat.completions.create(**body, logprobs=True, top_logprobs=5, stream=True)
    streamed = [
        c
        for ch in chunks
        if ch.choices and ch.choices[0].logprobs
        for c in ch.choices[0].logprobs.content
    ]
    _assert_same(streamed, content)


def test_completions_json_and_stream_logprobs(sdk, http, model):
    body = {"model": BASE, "prompt": PROMPT, "max_tokens": 10, "temperature": 0}
    r = sdk.completions.create(**body, logprobs=2)
    lp = r.choices[0].logprobs
    text = r.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 10
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(10)]
    assert all(text[o : o + len(t)] == t for o, t in zip(lp.text_offset, lp.tokens, strict=True))
    want = _reference(
        model, encode_prompt(WordTokenizer(), PROMPT, chat=False), _ids(lp.tokens), SamplingParams()
    )
    for j, (token, value, top) in enumerate(
        zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True)
    ):
        assert abs(value - want[j, _ids([token])[0]].item()) < TOL
        assert len(top) == 2 and list(top) == sorted(top, key=top.get, reverse=True)
        assert top[token] == value  # greedy: the chosen token is the most likely
    chunks = list(sdk.completions.create(**body, logprobs=2, stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset  # offsets continue
    streamed = [d for p in parts for d in p.top_logprobs]
    assert [list(d) for d in streamed] == [list(d) for d in lp.top_logprobs]
    assert all(
        abs(d[t] - w[t]) < TOL for d, w in zip(streamed, lp.top_logprobs, strict=True) for t in d
    )
    raw = http.post("/v1/completions", json=body).json()
    assert raw["choices"][0]["logprobs"] is None and raw["choices"][0]["text"] == text


@pytest.mark.parametrize(
    "path, extra, param",
    [
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ("/v1/completions", {"logprobs": 6}, "logprobs"),
        ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ],
)
def test_out_of_range_logprobs_are_400s(http, sdk, path, extra, param):
    body = {"model": BASE, "max_tokens": 4}
    body |= {"messages": MESSAGES} if "chat" in path else {"prompt": PROMPT}
    r = http.post(path, json=body | extra)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, "invalid_value")
    with pytest.raises(openai.BadRequestError):
        if "chat" in path:
            sdk.chat.completions.create(**body, **extra)
        else:
            sdk.completions.create(**body, **extra)


def test_delta_wire_is_unchanged_without_logprobs():
    plain = Delta(text="w1 ", token_ids=[1])
    assert plain.model_dump() == {"type": "delta", "text": "w1 ", "token_ids": [1]}
    with_lp = {
        "type": "delta",
        "text": "",
        "token_ids": [1],
        "logprobs": [
            {
                "token": "w1 ",
                "token_id": 1,
                "logprob": -0.5,
                "top_logprobs": [{"token": "w1 ", "token_id": 1, "logprob": -0.5}],
            }
        ],
    }
    assert parse_event(with_lp).model_dump() == with_lp  # across Ray as a dict and back


def test_logprobs_cover_every_completion_token_when_text_is_held_back_or_stopped(sdk):
    """A stop string holds text back (chunks may carry logprobs and no text) and cuts it: the
    logprobs still name every completion token, the text is a prefix of their join."""
    body = {"model": BASE, "prompt": PROMPT, "max_tokens": 12, "temperature": 1, "seed": 3}
    body["logprobs"] = 1
    full = sdk.completions.create(**body).choices[0]
    words = full.logprobs.tokens
    at = next(j for j in range(2, len(words)) if words[j] not in words[:j])
    stop = words[at]  # "w<i> ": first reached at token `at`
    for stream in (False, True):
        got = sdk.completions.create(**body, stop=[stop, "never-seen"], stream=stream)
        if stream:
            chunks = [c for c in got if c.choices]
            text = "".join(c.choices[0].text for c in chunks)
            tokens = [
                t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens
            ]
            assert any(c.choices[0].logprobs and not c.choices[0].text for c in chunks)
        else:
            text, tokens = got.choices[0].text, got.choices[0].logprobs.tokens
        assert stop not in text and "".join(tokens).startswith(text)
        assert tokens == full.logprobs.tokens[: len(tokens)] and len(tokens) > at
