"""scripts/draft_replay.py: the replay of a proposer on a recorded output and the oracle bound,
on a worked example (prompt [1, 2, 3, 4, 1], output [2, 3, 4, 9])."""

from __future__ import annotations

import pytest
from script_module import load_script

from specserve.engine.tree import DraftTree

CURVES = {"chain": {1: 1.0, 8: 1.25}, "tree": {8: 1.5}}
ROWS = [{"task": "t", "prompt": [1, 2, 3, 4, 1], "output": [2, 3, 4, 9]}]


@pytest.fixture(scope="module")
def replay():
    return load_script("draft_replay")


def test_accepted_example(replay):
    assert replay.accepted(DraftTree((5, 6, 7), (-1, 0, -1)), [5, 6, 9], 0) == 2
    assert replay.accepted(DraftTree((5, 6, 7), (-1, 0, -1)), [7, 6], 0) == 1


def test_prompt_lookup_copies_in_one_step(replay):
    """ "1" was followed by 2 3 4 1: three accepted, then the bonus 9; one 5-wide step."""
    tokens, steps, cost = replay.replay(ROWS, "prompt_lookup", {}, CURVES, warm=False)["t"]
    assert (tokens, steps, cost) == (4, 1, 1.25)


def test_hybrid_replays_without_a_model(replay):
    tokens, steps, _ = replay.replay(ROWS, "hybrid", {}, CURVES, warm=True)["t"]
    assert (tokens, steps) == (4, 1)


def test_oracle_takes_the_longest_copy(replay):
    rows = [{"task": "t", "prompt": [1, 2, 5, 1, 2, 3, 1], "output": [2, 3, 7]}]
    # the older copy "2 5" gives one token, the newer "2 3 1" two: then the bonus 7
    assert replay.oracle(rows, CURVES, warm=False)["t"] == [3, 1, 1.25]
