"""The typed OpenAI responses dump to OpenAI's JSON: keys OpenAI leaves out stay absent (a chat
choice's `logprobs` unless asked, a chunk's `usage` / `specserve`), a text choice's `logprobs` is
null unless asked, -inf log-probabilities are floored, text offsets continue over a stream."""

from __future__ import annotations

from done_event import done_event

from specserve.platform.api.responses import LOGPROB_FLOOR
from specserve.platform.api.shaping import Reply
from specserve.platform.events import DecodedLogprob, TopToken


def _lp(token: str, logprob: float, *tops: tuple[str, float]) -> DecodedLogprob:
    top = [TopToken(token=t, token_id=i, logprob=v) for i, (t, v) in enumerate(tops)]
    return DecodedLogprob(token=token, token_id=99, logprob=logprob, top_logprobs=top)


def test_chat_choices_carry_logprobs_only_when_asked():
    reply = Reply("chat", "base", "m", 0.0)
    assert reply.chunk_choice("", "stop").model_dump() == {
        "index": 0,
        "delta": {},
        "finish_reason": "stop",
    }
    asked = reply.choice("é", "length", [_lp("é", float("-inf"), ("a", -0.5))], index=1)
    assert asked.model_dump() == {
        "index": 1,
        "message": {"role": "assistant", "content": "é"},
        "finish_reason": "length",
        "logprobs": {
            "content": [
                {
                    "token": "é",
                    "logprob": LOGPROB_FLOOR,
                    "bytes": [195, 169],
                    "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": [97]}],
                }
            ]
        },
    }


def test_text_choices_say_null_and_continue_offsets():
    reply = Reply("completions", "base", "m", 0.0)
    assert reply.choice("hi", "stop").model_dump() == {
        "index": 0,
        "text": "hi",
        "finish_reason": "stop",
        "logprobs": None,
    }
    first = reply.chunk_choice("ab", None, [_lp("a", -0.1, ("b", -0.2)), _lp("b", -0.3)])
    second = reply.chunk_choice("c", None, [_lp("c", -0.4)])
    assert first.model_dump()["logprobs"] == {
        "tokens": ["a", "b"],
        "token_logprobs": [-0.1, -0.3],
        "top_logprobs": [{"b": -0.2, "a": -0.1}, {"b": -0.3}],
        "text_offset": [0, 1],
    }
    assert second.model_dump()["logprobs"]["text_offset"] == [2]


def test_envelopes_name_their_object_and_add_usage_or_specserve_where_due():
    done = done_event(3)
    chat = Reply("chat", "base", "m", 0.0)
    body = chat.whole([chat.choice("x", "length")], done.usage, done.specserve).model_dump()
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "specserve"]
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    chunk = chat.chunk([chat.chunk_choice("x", None)]).model_dump()
    assert list(chunk) == ["id", "object", "created", "model", "choices"]
    assert chunk["object"] == "chat.completion.chunk"
    text = Reply("completions", "base", "m", 0.0)
    last = text.chunk([], usage=done.usage).model_dump()
    assert last["object"] == "text_completion" and last["choices"] == []
    assert last["usage"] == done.usage.model_dump() and "specserve" not in last
    final = text.chunk([text.chunk_choice("", "stop")], specserve=done.specserve).model_dump()
    assert final["specserve"] == done.specserve.model_dump() and "usage" not in final
