"""Logprobs of committed tokens: the pure functions against a slow reference, and — for every
strategy, greedy and seeded sampling, alone and in a batch — each committed token's logprob and
top candidates equal those of a plain full forward over the committed prefix (fp32, 1e-5)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from schedules import STRATEGIES

from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.decode.engine import Engine
from specserve.engine.logprobs import committed_rows, logprob_rows, step_logprobs, token_logprobs
from specserve.engine.sampling import SamplingParams, target_probs

GREEDY = SamplingParams(max_new_tokens=24, logprobs=5)
SAMPLED = SamplingParams(
    max_new_tokens=24, temperature=0.7, top_p=0.9, top_k=12, seed=3, logprobs=5
)
TOL = 1e-5


def _slow_top(row: list[float], k: int) -> list[tuple[int, float]]:
    finite = [(t, v) for t, v in enumerate(row) if math.isfinite(v)]
    return sorted(finite, key=lambda tv: (-tv[1], tv[0]))[:k]


def test_docstring_examples():
    logits = torch.tensor([[2.0, 1.0, 0.0, -9.0]])
    got = logprob_rows(logits, SamplingParams(temperature=1.0, top_k=2))[0].tolist()
    assert got[:2] == pytest.approx([-0.3133, -1.3133], abs=1e-4) and got[2:] == [-math.inf] * 2
    assert logprob_rows(logits, SamplingParams())[0].tolist() == pytest.approx(
        [-0.4076, -1.4076, -2.4076, -11.4076], abs=1e-4
    )
    assert committed_rows([0, 2]) == [0, 1, 3]
    row = torch.tensor([[-0.5, -1.2, -0.5, -math.inf]])
    for k in (3, 5):
        (lp,) = token_logprobs(row, [0], [1], k)
        assert lp.token_id == 1 and lp.logprob == pytest.approx(-1.2)
        top = [(t.token_id, t.logprob) for t in lp.top]
        assert top == [(0, -0.5), (2, -0.5), (1, pytest.approx(-1.2))]


@pytest.mark.parametrize("seed", range(6))
def test_token_logprobs_match_the_slow_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.log_softmax(torch.randn(7, 40, generator=gen), dim=-1)
    rows = torch.round(rows * 4) / 4  # many exact ties
    rows[torch.rand(7, 40, generator=gen) < 0.4] = -math.inf  # masked by top-k / top-p
    rows[3, :] = -math.inf
    rows[3, 5] = 0.0  # a row with one finite entry
    rng = random.Random(seed)
    row_of = [rng.randrange(7) for _ in range(9)]
    tokens = [rng.randrange(40) for _ in row_of]
    for k in (0, 1, 5, 20, 40):
        got = token_logprobs(rows, row_of, tokens, k)
        for lp, r, t in zip(got, row_of, tokens, strict=True):
            want = _slow_top(rows[r].tolist(), k)
            assert [(c.token_id, c.logprob) for c in lp.top] == want
            assert lp.token_id == t and lp.logprob == rows[r, t].item()


def test_step_logprobs_read_the_committed_rows_only():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 30, generator=gen)
    params = SamplingParams(temperature=0.8, top_p=0.8, logprobs=3)
    full = torch.log(target_probs(logits, params))
    got = step_logprobs(full, [1, 3], [11, 12, 13], 3)
    for lp, r in zip(got, [0, 2, 4], strict=True):
        assert lp.logprob == pytest.approx(full[r, lp.token_id].item(), abs=1e-6)
        assert [c.token_id for c in lp.top] == [t for t, _ in _slow_top(full[r].tolist(), 3)]


@pytest.fixture(scope="module")
def engine(drafting_engine):
    return drafting_engine(eagle_seed=4)


def _prompt(seed: int, n: int = 40) -> list[int]:
    rng = random.Random(seed)
    motif = [rng.randrange(96) for _ in range(5)]
    return [motif[i % 5] if rng.random() < 0.85 else rng.randrange(96) for i in range(n)]


def _check_against_full_forward(model, prompt, output, logprobs, params) -> None:
    """Each committed token's logprob and top candidates, as a plain forward over prompt +
    output scores them at that position."""
    assert [lp.token_id for lp in logprobs] == output
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    want = logprob_rows(logits[len(prompt) - 1 : len(prompt) - 1 + len(output)], params)
    k = params.logprobs
    for j, lp in enumerate(logprobs):
        assert abs(lp.logprob - want[j, lp.token_id].item()) < TOL, j
        ref = _slow_top(want[j].tolist(), k)
        assert len(lp.top) == len(ref) and [c.token_id for c in lp.top] == [t for t, _ in ref]
        assert all(abs(c.logprob - v) < TOL for c, (_, v) in zip(lp.top, ref, strict=True))


def _run(engine, prompt, params, strategy):
    state = engine.start(prompt, params, strategy, STRATEGIES[strategy])
    logprobs = []
    for step in engine.stream(state):
        assert step.logprobs is not None and len(step.logprobs) == len(step.new_ids)
        logprobs.extend(step.logprobs)
    return state, logprobs


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_every_strategy_reports_the_full_forward_logprobs(engine, strategy, params):
    accepted = 0
    for seed in (0, 2):
        prompt = _prompt(seed)
        state, logprobs = _run(engine, prompt, params, strategy)
        assert len(state.output_ids) == params.max_new_tokens
        _check_against_full_forward(engine.model, prompt, state.output_ids, logprobs, params)
        accepted += sum(state.accepted_by_depth)
    assert accepted > 0 or strategy == "ar"  # drafts were accepted: rows past the root were read


def test_a_cut_step_keeps_logprobs_aligned_and_masked_tokens_out(engine):
    """max_new_tokens and EOS cut a step's accepted path; top_k 3 leaves 3 candidates of 5."""
    params = SamplingParams(max_new_tokens=7, temperature=0.9, top_k=3, seed=5, logprobs=5)
    prompt = _prompt(2)
    state, logprobs = _run(engine, prompt, params, "prompt_lookup")
    assert len(logprobs) == len(state.output_ids) == 7
    assert all(len(lp.top) == 3 for lp in logprobs)
    _check_against_full_forward(engine.model, prompt, state.output_ids, logprobs, params)
    eos = state.output_ids[4]
    stops = Engine(engine.model, engine.tokenizer, frozenset({eos}), drafters=engine.drafters)
    state, logprobs = _run(stops, prompt, params.model_copy(update={"max_new_tokens": 20}), "ar")
    assert state.finish_reason == "stop" and state.output_ids[-1] == eos
    assert [lp.token_id for lp in logprobs] == state.output_ids


def test_no_logprobs_unless_asked(engine):
    state = engine.start(_prompt(0), SamplingParams(max_new_tokens=4), "lookahead")
    assert all(step.logprobs is None for step in engine.stream(state))


def test_batched_rows_report_the_full_forward_logprobs(engine):
    """A Scheduler batch: every strategy, greedy and sampled, prompts longer than the prefill
    chunk, joining at different steps."""
    scheduler = Scheduler(engine, BatchSettings(max_batch=6, prefill_chunk=16))
    reqs, seen = [], {}
    for i, (strategy, params) in enumerate(
        (s, p) for s in STRATEGIES for p in (GREEDY, SAMPLED.model_copy(update={"seed": 11}))
    ):
        prompt = _prompt(10 + i, n=random.Random(i).choice([5, 23, 40]))
        reqs.append((i % 4, prompt, params, strategy))
        seen[i] = []
    steps, states = 0, {}
    while steps < 500 and (len(states) < len(reqs) or scheduler.active()):
        for i, (join_at, prompt, params, strategy) in enumerate(reqs):
            if join_at == steps:
                states[i] = engine.start(prompt, params, strategy, STRATEGIES[strategy])

                def sink(step, finished, i=i):
                    if step is not None:
                        assert len(step.logprobs) == len(step.new_ids)
                        seen[i].extend(step.logprobs)

                scheduler.submit(states[i], "t", True, sink)
        scheduler.step()
        steps += 1
    for i, (_, prompt, params, _) in enumerate(reqs):
        output = states[i].output_ids
        assert len(output) == params.max_new_tokens
        _check_against_full_forward(engine.model, prompt, output, seen[i], params)
