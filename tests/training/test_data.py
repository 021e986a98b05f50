"""Self-distillation data: prompts (deterministic, distinct, never benchmark text), padding,
answer cutting, batched generation equal to one-by-one greedy decoding."""

from __future__ import annotations

import torch

from specserve.training.data import (
    DistillData,
    cut_answer,
    frequent_vocab,
    generate_answers,
    left_pad,
    token_counts,
)
from specserve.training.prompts import training_prompts


def test_training_prompts_deterministic_distinct_and_varied():
    a, b = training_prompts(120), training_prompts(120)
    assert a == b and len(set(a)) == 120
    starts = {p.split()[0] for p in a}
    assert {"Write", "Explain", "Translate", "Summarize", "Answer"} <= starts
    assert training_prompts(50, seed=1) != training_prompts(50, seed=2)


def test_left_pad_and_cut_answer_examples():
    ids, mask = left_pad([[5, 6], [7]], 0)
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]
    assert cut_answer([4, 2, 9], frozenset({2})) == [4, 2]
    assert cut_answer([4, 9], frozenset({2})) == [4, 9]


def test_frequent_vocab_example():
    assert frequent_vocab(torch.tensor([0, 5, 2, 9]), 2).tolist() == [1, 3]
    assert frequent_vocab(torch.tensor([0, 5, 0, 9]), 3).tolist() == [1, 3]
    assert token_counts([[1, 1, 3]], 5).tolist() == [0, 2, 0, 1, 0]


def test_batched_generation_equals_single_greedy(tiny_llama, make_engine, tmp_path):
    from specserve.engine.sampling import SamplingParams

    model = tiny_llama(1, init_range=0.1)
    prompts = [[3, 4, 5], [7] * 9, [1, 2], [9, 8, 7, 6, 5, 4]]
    data = DistillData(prompts=prompts, answers=[None] * 4, max_new_tokens=10, source="test")
    eos = frozenset({95})
    path = tmp_path / "d.pt"
    generate_answers(model, data, eos, batch_size=3, save_to=path)
    engine = make_engine(model, eos_ids=eos)
    for p, a in zip(prompts, data.answers):
        assert a == engine.generate(p, SamplingParams(max_new_tokens=10), "ar").output_ids
    assert DistillData.load(path).answers == data.answers


def test_generation_stops_at_the_deadline_and_resumes(tiny_llama, tmp_path):
    model = tiny_llama(1, init_range=0.1)
    data = DistillData(prompts=[[1, 2]] * 4, answers=[None] * 4, max_new_tokens=3, source="t")
    generate_answers(model, data, frozenset(), batch_size=2, deadline=0.0)
    assert data.done == []
    generate_answers(model, data, frozenset(), batch_size=2)
    assert data.done == [0, 1, 2, 3]
