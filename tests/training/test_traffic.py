"""Served traffic as training data: encoded as the model server encodes it, in the order served
(the most recent held out), and the rule that a retrained drafter replaces the current one only
when it beats it."""

from __future__ import annotations

import pytest

from specserve.engine.prompts import encode_messages, encode_prompt
from specserve.training.corpus import traffic_corpus
from specserve.training.run import traffic_split
from specserve.training.settings import DrafterTrainSettings
from specserve.training.traffic import HeldoutFigures, ServedExample, replacement


def figures(tokens: int, forwards: int) -> HeldoutFigures:
    return HeldoutFigures(prompts=4, tokens=tokens, forwards=forwards, drafted=40, accepted=10)


def test_replacement_only_when_the_candidate_beats_the_current_drafter():
    current, better, same = figures(120, 100), figures(150, 100), figures(120, 100)
    assert replacement(current, better, 0.0)[0] is True
    assert "1.50 beats the current drafter's 1.20" in replacement(current, better, 0.0)[1]
    refused, why = replacement(current, same, 0.0)
    assert refused is False and "does not beat" in why
    assert replacement(current, better, 0.5)[0] is False  # +0.30 is not above the 0.5 asked
    assert replacement(None, same, 0.0) == (True, replacement(None, same, 0.0)[1])
    assert "no current drafter" in replacement(None, same, 0.0)[1]
    assert better.model_dump()["tau"] == 1.5  # the figures carry their tau when stored


def test_a_served_example_has_one_prompt():
    with pytest.raises(ValueError, match="prompt or messages"):
        ServedExample(output="w3")
    with pytest.raises(ValueError, match="prompt or messages"):
        ServedExample(prompt="w3", messages=[{"role": "user", "content": "w4"}], output="w5")


def test_traffic_corpus_encodes_as_served_in_order(tiny_hf_tokenizer):
    tok = tiny_hf_tokenizer
    chat = [{"role": "user", "content": "w5 w6"}]
    served = [
        ServedExample(prompt="w3 w4", output="w7 w8 w9"),
        ServedExample(messages=chat, output="w10 w11", finish_reason="length"),
        ServedExample(prompt="w3", output="w12"),  # one answer token + EOS: kept
        ServedExample(prompt="w3", output="", finish_reason="length"),  # nothing to learn
    ]
    corpus = traffic_corpus(tok, 2, served)
    first = encode_prompt(tok, "w3 w4", chat=False)
    assert corpus.sequences[0] == first + [10, 11, 12, 2] and corpus.prompt_lens[0] == len(first)
    second = encode_messages(tok, chat)
    assert corpus.sequences[1] == second + [13, 14]  # cut by length: no EOS
    assert len(corpus.sequences) == 3
    older, recent = traffic_split(tok, 2, served, DrafterTrainSettings(kind="medusa"))
    assert recent.sequences == corpus.sequences[-1:]  # the most recent held out
    assert older.sequences == corpus.sequences[:2]
    assert traffic_corpus(tok, 2, served[:1]).sequences != corpus.sequences
