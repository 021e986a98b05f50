from __future__ import annotations

import random

import pytest

from specserve.engine.textstream import TextStream


class PieceTokenizer:
    """Each id is an index into a fixed list of strings."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.pieces[i] for i in ids)


def test_docstring_example():
    tok = PieceTokenizer(["abEN", "D!"])
    ts = TextStream(tok, ["END"])
    assert ts.push([0]) == "ab"
    assert not ts.stopped
    assert ts.push([1]) == ""
    assert ts.stopped and ts.text == "ab"
    assert ts.finish() == ""
    assert ts.text == "ab"


def test_no_stop_streams_everything(tokenizer):
    ts = TextStream(tokenizer, [])
    assert ts.push([0, 1]) == "ab"
    assert ts.push([2]) == "c"
    assert ts.push([]) == ""
    assert ts.finish() == ""
    assert ts.text == "abc" and not ts.stopped


def test_holdback_flushes_at_finish(tokenizer):
    ts = TextStream(tokenizer, ["xyz"])  # holdback = len("xyz") - 1 = 2
    assert ts.push([0, 1, 2, 3]) == "ab"  # "abcd": the last 2 chars are held back
    assert ts.push([23]) == "c"  # "abcdx": "dx" could still grow into "xyz"
    assert ts.finish() == "dx"
    assert ts.text == "abcdx" and not ts.stopped


def test_holdback_then_finish_exact(tokenizer):
    ts = TextStream(tokenizer, ["qq", "wxyz"])  # holdback = 3
    deltas = [ts.push([i]) for i in range(6)]  # "abcdef"
    assert "".join(deltas) == "abc"
    assert ts.finish() == "def"
    assert ts.text == "abcdef" and not ts.stopped
    assert ts.finish() == ""  # idempotent


@pytest.mark.parametrize("split", range(1, 9))
def test_stop_across_token_boundaries(split):
    """The same text cut into tokens at every place: the stop is found and excluded."""
    text = "hello STOP world"
    pieces = [text[:split], text[split : split + 3], text[split + 3 :]]
    pieces = [p for p in pieces if p]
    ts = TextStream(PieceTokenizer(pieces), ["STOP"])
    out = ""
    for i in range(len(pieces)):
        out += ts.push([i])
        if ts.stopped:
            break
    assert ts.stopped
    assert out == ts.text == "hello "
    assert ts.push([0]) in ("",)  # nothing after a stop
    assert ts.finish() == ""
    assert ts.text == "hello "


def test_stop_in_one_char_tokens_never_emits_a_prefix_of_it(tokenizer):
    # ids -> letters: 3 'd', 4 'e', 13 'n'; stop "end" straddles three tokens
    ts = TextStream(tokenizer, ["end"])
    emitted = []
    for i in [0, 1, 4, 13, 2, 4, 13, 3, 5, 6]:  # "abencend fg": "en" then "c" breaks it, then "end"
        emitted.append(ts.push([i]))
        if ts.stopped:
            break
    assert ts.stopped
    assert "".join(emitted) == ts.text == "abenc"


def test_earliest_of_several_stops_wins(word_tokenizer):
    ts = TextStream(word_tokenizer, ["t7 ", "t3 t4"])
    out = ts.push([1, 2, 3]) + ts.push([4, 5, 7])
    assert ts.stopped
    assert out == ts.text == "t1 t2 "


def test_stop_at_very_start(tokenizer):
    ts = TextStream(tokenizer, ["ab"])
    assert ts.push([0, 1, 2]) == ""
    assert ts.stopped and ts.text == ""


def test_empty_stop_strings_are_ignored(tokenizer):
    ts = TextStream(tokenizer, ["", ""])
    assert ts.push([0]) == "a"
    assert not ts.stopped


def test_incomplete_utf8_is_held_back():
    # a tokenizer that, like byte-level BPE, decodes half a character as U+FFFD
    tok = PieceTokenizer(["ok ", "\ufffd", "é"])

    class Joining:
        def decode(self, ids, skip_special_tokens=True):
            s = tok.decode(ids)
            return s.replace("\ufffdé", "é")

    ts = TextStream(Joining(), [])
    assert ts.push([0]) == "ok "
    assert ts.push([1]) == ""
    assert ts.push([2]) == "é"
    assert ts.text == "ok é"


@pytest.mark.parametrize("seed", range(20))
def test_random_streams_equal_batch_truncation(seed, tokenizer):
    """Deltas concatenate to the full decode cut at the first stop (or all of it)."""
    rng = random.Random(seed)
    ids = [rng.randrange(5) for _ in range(40)]  # letters a..e
    full = tokenizer.decode(ids)
    stops = [
        "".join(rng.choice("abcde") for _ in range(rng.randrange(1, 4)))
        for _ in range(rng.randrange(1, 3))
    ]
    ts = TextStream(tokenizer, stops)
    out, i = "", 0
    while i < len(ids) and not ts.stopped:
        k = rng.randrange(1, 4)
        out += ts.push(ids[i : i + k])
        i += k
    out += ts.finish()
    hits = [full.find(s) for s in stops if full.find(s) >= 0]
    expected = full[: min(hits)] if hits else full
    assert out == ts.text == expected
    assert ts.stopped == bool(hits)
