"""n choices share one prefill: a group's leader prefills the prompt to its last token, each
follower copies that cache; every choice decodes exactly what it decodes alone with its seed
(fp32, every strategy, chunked prompts), prompt positions are computed once, and cancelling any
member (the leader too) leaves the others whole."""

from __future__ import annotations

import random

import pytest
from schedules import STRATEGIES

from specserve.engine.batch.prefix_share import share_prefill
from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.sampling import SamplingParams


@pytest.fixture(scope="module")
def engine(drafting_engine):
    return drafting_engine()


def _prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    motif = [rng.randrange(96) for _ in range(5)]
    return [motif[i % 5] if rng.random() < 0.85 else rng.randrange(96) for i in range(n)]


def _params(seed: int, temperature: float = 0.8) -> SamplingParams:
    return SamplingParams(max_new_tokens=16, temperature=temperature, seed=seed)


def _alone(engine, prompt, params, strategy) -> list[int]:
    return engine.generate(prompt, params, strategy, STRATEGIES[strategy]).output_ids


def _run_group(engine, scheduler, prompt, params_list, strategy, cancel=()):
    states = [engine.start(prompt, p, strategy, STRATEGIES[strategy]) for p in params_list]
    outs = [[] for _ in states]
    finished = [False] * len(states)

    def sink_for(i):
        def sink(result, done):
            if result is not None:
                outs[i].extend(result.new_ids)
            finished[i] = finished[i] or done

        return sink

    tickets = scheduler.submit_group(states, "t", True, [sink_for(i) for i in range(len(states))])
    for i in cancel:
        scheduler.cancel(tickets[i])
    steps = 0
    while not all(finished):
        scheduler.step()
        steps += 1
        assert steps < 500
    return outs


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_each_choice_equals_its_seed_alone_and_the_prompt_is_computed_once(engine, strategy):
    prompt = _prompt(40)
    params_list = [_params(seed) for seed in (11, 12, 13)]
    scheduler = Scheduler(engine, BatchSettings(max_batch=4, prefill_chunk=16))
    outs = _run_group(engine, scheduler, prompt, params_list, strategy)
    for params, out in zip(params_list, outs, strict=True):
        assert out == _alone(engine, prompt, params, strategy)
    assert len({tuple(o) for o in outs}) > 1  # different seeds: different choices
    assert scheduler.totals["prefill_tokens"] == len(prompt) - 1 + 3  # once, + a step each
    assert scheduler.totals["shared_prefill_tokens"] == 2 * (len(prompt) - 1)
    assert scheduler.active() == 0 and scheduler.reserved == 0


@pytest.mark.parametrize(("prompt_len", "chunk"), [(17, 16), (16, 16), (33, 16), (5, 4)])
def test_prompts_that_end_on_a_chunk_boundary(engine, prompt_len, chunk):
    prompt = _prompt(prompt_len, seed=prompt_len)
    params_list = [_params(seed) for seed in (4, 5)]
    scheduler = Scheduler(engine, BatchSettings(max_batch=4, prefill_chunk=chunk))
    outs = _run_group(engine, scheduler, prompt, params_list, "prompt_lookup")
    for params, out in zip(params_list, outs, strict=True):
        assert out == _alone(engine, prompt, params, "prompt_lookup")


def test_greedy_choices_are_identical_and_a_one_token_prompt_works(engine):
    scheduler = Scheduler(engine, BatchSettings(max_batch=4))
    outs = _run_group(engine, scheduler, [7], [SamplingParams(max_new_tokens=8)] * 2, "ar")
    assert outs[0] == outs[1] == _alone(engine, [7], SamplingParams(max_new_tokens=8), "ar")


@pytest.mark.parametrize("cancelled", [0, 1])
def test_cancelling_a_member_before_admission_leaves_the_others_whole(engine, cancelled):
    prompt = _prompt(20, seed=3)
    params_list = [_params(seed) for seed in (1, 2, 3)]
    scheduler = Scheduler(engine, BatchSettings(max_batch=4, prefill_chunk=8))
    outs = _run_group(engine, scheduler, prompt, params_list, "lookahead", cancel=[cancelled])
    for i, (params, out) in enumerate(zip(params_list, outs, strict=True)):
        if i == cancelled:
            assert out == []
        else:
            assert out == _alone(engine, prompt, params, "lookahead")
    assert scheduler.active() == 0 and scheduler.reserved == 0


def test_groups_wider_than_the_batch_or_with_other_prompts_are_refused(engine):
    scheduler = Scheduler(engine, BatchSettings(max_batch=2))
    states = [engine.start([1, 2, 3], _params(s)) for s in range(3)]
    with pytest.raises(ValueError, match="exceeds the batch"):
        scheduler.submit_group(states, "t", True, [lambda *a: None] * 3)
    other = [engine.start([1, 2, 3], _params(0)), engine.start([1, 2, 4], _params(1))]
    with pytest.raises(ValueError, match="share prompt"):
        scheduler.submit_group(other, "t", True, [lambda *a: None] * 2)
    with pytest.raises(ValueError, match="last token"):
        share_prefill(other[0], other[1])
