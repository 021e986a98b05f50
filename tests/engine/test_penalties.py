"""Presence / frequency penalties and logit_bias stay lossless: each verify row is penalized with
its own prefix (a slow reference checks the rows), and greedy decoding with penalties gives, for
every strategy alone and in random Scheduler batches, what a plain loop of full forwards with
the same penalties gives (fp32)."""

from __future__ import annotations

import random

import pytest
import torch
from schedules import STRATEGIES

from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.penalties import penalized, prefix_counts
from specserve.engine.sampling import SamplingParams
from specserve.engine.tree import DraftTree


def _reference_row(logits, prefix, params):
    """Slow: one row, penalties token by token."""
    out = logits.float().clone()
    for token in set(prefix):
        n = prefix.count(token)
        out[token] -= params.frequency_penalty * n + params.presence_penalty
    for token, bias in params.logit_bias.items():
        out[token] += bias
    return out


def test_docstring_examples():
    counts = prefix_counts(DraftTree.from_chains([[4, 7]]), [4, 4], 10)
    assert counts[:, 4].tolist() == [2, 3, 3] and counts[:, 7].tolist() == [0, 0, 1]
    params = SamplingParams(frequency_penalty=0.5)
    out = penalized(torch.zeros(1, 5), DraftTree(), [3, 3], params)
    assert out[0].tolist() == [0, 0, 0, -1.0, 0]


def test_every_row_sees_its_own_prefix():
    tree = DraftTree.from_chains([[1, 2, 1], [1, 3], [4]])
    output = [2, 2, 5]
    params = SamplingParams(presence_penalty=0.7, frequency_penalty=0.3, logit_bias={3: -2.0})
    logits = torch.randn(len(tree) + 1, 8)
    got = penalized(logits, tree, output, params)
    for row in range(len(tree) + 1):
        path, node = [], row - 1
        while node >= 0:
            path.insert(0, tree.tokens[node])
            node = tree.parents[node]
        torch.testing.assert_close(got[row], _reference_row(logits[row], output + path, params))
    assert penalized(logits, tree, output, SamplingParams()) is logits  # untouched without any


def test_bias_ids_outside_the_vocabulary_are_refused(engine):
    with pytest.raises(ValueError, match="logit_bias"):
        engine.start([1, 2, 3], SamplingParams(logit_bias={10_000: 1.0}))


@pytest.fixture(scope="module")
def engine(drafting_engine):
    return drafting_engine()


def _plain(model, prompt, params) -> list[int]:
    """Greedy with penalties by full forwards over the whole prefix (no cache, no drafts)."""
    tokens, output = list(prompt), []
    for _ in range(params.max_new_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([tokens])).logits[0, -1]
        token = int(_reference_row(logits, output, params).argmax())
        tokens.append(token)
        output.append(token)
    return output


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    motif = [rng.randrange(96) for _ in range(4)]
    return [motif[i % 4] if rng.random() < 0.9 else rng.randrange(96) for i in range(30)]


PENALTIES = [
    {"frequency_penalty": 0.4},
    {"presence_penalty": 0.8, "frequency_penalty": 0.1},
    {"presence_penalty": -0.5, "logit_bias": {5: 3.0, 9: -100.0}},
]


@pytest.mark.parametrize("penalty", PENALTIES)
def test_greedy_with_penalties_equals_plain_decoding_for_every_strategy(engine, penalty):
    params = SamplingParams(max_new_tokens=24, **penalty)
    prompt = _prompt(len(str(penalty)))
    want = _plain(engine.model, prompt, params)
    assert want != _plain(engine.model, prompt, SamplingParams(max_new_tokens=24))  # it bites
    for strategy, config in STRATEGIES.items():
        assert engine.generate(prompt, params, strategy, config).output_ids == want, strategy


def test_penalized_requests_in_a_batch_equal_alone(engine):
    rng = random.Random(5)
    reqs = []
    for i in range(8):
        strategy = rng.choice(list(STRATEGIES))
        params = SamplingParams(
            max_new_tokens=rng.randint(8, 20),
            temperature=rng.choice([0.0, 0.9]),
            seed=i,
            **rng.choice(PENALTIES),
        )
        reqs.append((_prompt(i), params, strategy))
    scheduler = Scheduler(engine, BatchSettings(max_batch=4, prefill_chunk=16), lambda k: 1 + k / 4)
    seen = {i: [] for i in range(len(reqs))}
    for i, (prompt, params, strategy) in enumerate(reqs):
        state = engine.start(prompt, params, strategy, STRATEGIES[strategy])

        def sink(result, finished, i=i):
            if result is not None:
                seen[i].extend(result.new_ids)

        scheduler.submit(state, f"t{i % 2}", True, sink)
    while scheduler.active():
        scheduler.step()
    for i, (prompt, params, strategy) in enumerate(reqs):
        alone = engine.generate(prompt, params, strategy, STRATEGIES[strategy]).output_ids
        assert seen[i] == alone, (i, strategy)
