"""A decode's drafting and verifying seconds (what `bench` reports as a draft step's cost against
a verify step's): the proposer's propose and observe count as drafting, the target's forward as
verifying, decode steps only (the prompt's step is neither)."""

from __future__ import annotations

import time

from specserve.engine.sampling import SamplingParams

PAUSE = 0.03
PROMPT_PAUSE = 0.5  # the prompt step's pauses: 2 x 0.5 s, which drafting time must not hold


def _slowed(method, pause: float, first_pause: float):
    """`method` sleeping `first_pause` on its first call (the prompt's step), `pause` after."""
    calls = []

    def slow(*args, **kwargs):
        time.sleep(first_pause if not calls else pause)
        calls.append(1)
        return method(*args, **kwargs)

    return slow


def test_proposer_time_counts_as_drafting_and_not_as_verifying(model, make_engine):
    engine = make_engine(model)
    state = engine.start([3, 7, 9, 3, 7, 9, 11], SamplingParams(max_new_tokens=12), "prompt_lookup")
    state.proposer.propose = _slowed(state.proposer.propose, PAUSE, PROMPT_PAUSE)
    state.proposer.observe = _slowed(state.proposer.observe, PAUSE, PROMPT_PAUSE)
    for _ in engine.stream(state):
        pass
    result = engine.result(state)
    decode_steps = result.forwards - 1  # the first step verifies the prompt's rows too
    assert decode_steps >= 2
    assert result.draft_seconds >= 2 * PAUSE * decode_steps
    assert result.draft_seconds < 2 * PAUSE * decode_steps + PROMPT_PAUSE  # the prompt's not in
    assert 0 < result.verify_seconds < PAUSE * decode_steps  # no proposer pause counted here


def test_a_plain_decode_reports_both(model, make_engine):
    result = make_engine(model).generate([5, 6, 7], SamplingParams(max_new_tokens=8), "lookahead")
    assert result.draft_seconds > 0 and result.verify_seconds > 0
