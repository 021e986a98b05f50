"""Teacher data by prefill: batched rows equal single forwards (features and greedy tokens), the
deadline stops shortest first, and a second call reads the disk cache instead of the model, for
each sequence it has seen whatever the corpus around it."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from specserve.engine import hf_internals
from specserve.training import features
from specserve.training.features import (
    cache_key,
    length_batches,
    prefill,
    sequence_key,
    teacher_data,
)

SEQS = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]


def test_length_batches_example():
    assert length_batches([5, 2, 3], 6) == [[1, 2], [0]]
    assert length_batches([9], 4) == [[0]]  # too long for a batch: alone


@torch.inference_mode()
def test_prefill_rows_equal_single_forwards(tiny_llama):
    model = tiny_llama(0)
    for s, (f, g) in zip(SEQS, prefill(model, SEQS, (0, -1))):
        out = model(input_ids=torch.tensor([s]), output_hidden_states=True)
        assert torch.allclose(f, hf_internals.hidden_features(out, (0, -1))[0], atol=1e-5)
        assert g.tolist() == out.logits[0].argmax(-1).tolist()


@torch.inference_mode()
def test_prefill_under_autocast_keeps_bf16_features_near_the_exact_ones(tiny_llama):
    model = tiny_llama(0)
    exact = prefill(model, SEQS, (0, -1))
    for (f, g), (f_exact, _) in zip(prefill(model, SEQS, (0, -1), autocast=True), exact):
        assert f.dtype == torch.bfloat16 and g.dtype == torch.long
        assert f.shape == f_exact.shape
        assert torch.allclose(f.float(), f_exact, atol=0.1, rtol=0.05)


def test_teacher_data_stops_at_the_deadline_and_resumes_from_disk(
    tiny_llama, tmp_path, monkeypatch
):
    model = tiny_llama(0)
    late = teacher_data(model, SEQS, (-1,), tmp_path, batch_tokens=1, deadline=0.0)
    assert late.features == [None, None, None]  # past the deadline: no batch starts
    clock = iter([0.0, 0.0, 1.0, 10.0, 10.0])  # deadline 5: two batches start, not the third
    # only teacher_data's clock: a global patch also fed other threads of the suite (flaky)
    monkeypatch.setattr(features, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    part = teacher_data(model, SEQS, (-1,), tmp_path, batch_tokens=1, deadline=5.0)
    monkeypatch.undo()
    assert (
        part.features[0] is None and part.greedy[1].shape == (2,) and part.features[2] is not None
    )

    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    full = teacher_data(model, SEQS, (-1,), tmp_path, batch_tokens=64)
    assert len(calls) == 1  # only the sequence not cached yet
    again = teacher_data(model, SEQS, (-1,), tmp_path, batch_tokens=64)
    assert len(calls) == 1
    for a, b in zip(full.features + full.greedy, again.features + again.greedy):
        assert torch.equal(a, b)


def test_a_grown_corpus_prefills_only_its_new_sequences(tiny_llama, tmp_path):
    model = tiny_llama(0)
    first = teacher_data(model, SEQS, (-1,), tmp_path, batch_tokens=64)
    rows = []
    model.register_forward_hook(
        lambda _m, args, kw, out: rows.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    grown = [[11, 12, 13], SEQS[2], SEQS[0], [14, 15]]  # two new, two cached, another order
    second = teacher_data(model, grown, (-1,), tmp_path, batch_tokens=64)
    assert rows == [2]  # one batch: the two new sequences
    assert torch.equal(second.features[1], first.features[2])
    assert torch.equal(second.greedy[2], first.greedy[0])
    alone = prefill(model, [[14, 15]], (-1,))[0]
    assert torch.allclose(second.features[3], alone[0], atol=1e-5)


def test_sequence_key_is_the_tokens():
    assert sequence_key([1, 2, 3]) == sequence_key([1, 2, 3])
    assert len({sequence_key([1, 2, 3]), sequence_key([1, 2]), sequence_key([3, 2, 1])}) == 3


def test_cache_key_changes_with_what_the_data_depends_on():
    base = cache_key("w", None, torch.bfloat16, (-1,))
    others = [
        cache_key("w2", None, torch.bfloat16, (-1,)),
        cache_key("w", "a" * 64, torch.bfloat16, (-1,)),
        cache_key("w", None, torch.float32, (-1,)),
        cache_key("w", None, torch.bfloat16, (3, -1)),
        cache_key("w", None, torch.bfloat16, (-1,), autocast=True),
    ]
    assert len({base, *others}) == 6
