"""The variant's output index: the docstring's example, its bound, and its continuations against
a slow reference that scans every kept output."""

from __future__ import annotations

import random
import threading

import pytest

from specserve.engine.output_index import OutputIndex


def test_worked_example():
    index = OutputIndex()
    index.extend(1, [7, 1, 2])
    index.extend(2, [7, 1, 3, 7])
    assert index.continuations((7,), recent=8, max_len=2) == [(1, 3), (1, 2)]
    assert index.continuations((7,), recent=8, max_len=2, skip=2) == [(1, 2)]
    assert index.continuations((7,), recent=1, max_len=2) == [(1, 3)]
    assert index.continuations((2, 7, 1), recent=8, max_len=2) == []  # no such 3-gram
    assert index.continuations((3, 7), recent=8, max_len=2) == []  # no continuation yet


def test_outputs_grow_and_the_oldest_is_dropped():
    index = OutputIndex(max_outputs=2)
    index.extend(1, [5, 6])
    index.extend(1, [5, 8])  # the same request's next tokens
    assert index.continuations((5,), 8, 1) == [(8,), (6,)]
    index.extend(2, [5, 9])
    index.extend(3, [5, 4])
    assert len(index) == 2 and index.continuations((5,), 8, 1) == [(4,), (9,)]
    with pytest.raises(ValueError):
        OutputIndex(max_outputs=0)
    short = OutputIndex(max_tokens=3)
    short.extend(1, [5, 6, 5, 7])  # the fourth token is not kept
    assert short.continuations((5,), 8, 2) == [(6, 5)]


@pytest.mark.parametrize("seed", range(10))
def test_against_a_scan_of_every_output(seed):
    rng = random.Random(seed)
    index = OutputIndex(max_outputs=5)
    outputs = {}
    for output_id in rng.sample(range(1, 50), 8):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        for cut in sorted(rng.sample(range(len(tokens) + 1), 2)):  # written in pieces
            index.extend(output_id, tokens[len(outputs.get(output_id, [])) : cut])
            outputs[output_id] = tokens[:cut]
        index.extend(output_id, tokens[len(outputs[output_id]) :])
        outputs[output_id] = tokens
    kept = list(outputs)[-5:]
    suffix = tuple(rng.randrange(4) for _ in range(rng.randint(1, 3)))
    want = [
        tuple(outputs[o][s + len(suffix) : s + len(suffix) + 3])
        for o in reversed(kept)
        for s in reversed(range(len(outputs[o]) - len(suffix)))
        if tuple(outputs[o][s : s + len(suffix)]) == suffix
    ]
    assert index.continuations(suffix, 6, 3) == want[:6]


def test_concurrent_writers_lose_nothing():
    index = OutputIndex(max_outputs=8)

    def write(output_id):
        for token in range(200):
            index.extend(output_id, [1000 + output_id, token])

    threads = [threading.Thread(target=write, args=(i,)) for i in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for output_id in range(1, 5):
        assert len(index.continuations((1000 + output_id,), 1000, 1)) == 200
