from __future__ import annotations

import threading

import pytest

from specserve.engine.ngram_pool import NGramPool


def test_docstring_example_most_recent_first():
    pool = NGramPool()
    pool.add((5,), (6, 7))
    pool.add((5,), (8, 9))
    assert pool.get((5,), 2) == [(8, 9), (6, 7)]
    assert pool.get((5,), 1) == [(8, 9)]
    assert pool.get([5], 10) == [(8, 9), (6, 7)]  # lists work as keys
    assert pool.get((4,), 3) == []
    assert len(pool) == 2 and pool.num_keys == 1


def test_re_adding_moves_to_front_without_duplicating():
    pool = NGramPool()
    for cont in [(1,), (2,), (3,), (1,)]:
        pool.add((0,), cont)
    assert pool.get((0,), 5) == [(1,), (3,), (2,)]
    assert len(pool) == 3


def test_per_key_bound_drops_oldest():
    pool = NGramPool(max_per_key=3)
    for t in range(6):
        pool.add((9, 9), (t,))
    assert pool.get((9, 9), 10) == [(5,), (4,), (3,)]
    assert len(pool) == 3


def test_lru_key_eviction():
    pool = NGramPool(max_keys=2)
    pool.add((1,), (10,))
    pool.add((2,), (20,))
    pool.get((1,), 1)  # touch key 1: key 2 becomes least recently used
    pool.add((3,), (30,))
    assert pool.num_keys == 2
    assert pool.get((2,), 5) == []
    assert pool.get((1,), 5) == [(10,)] and pool.get((3,), 5) == [(30,)]
    pool.add((1,), (11,))  # adding to an existing key also refreshes it: key 3 is now oldest
    pool.add((4,), (40,))
    assert [k for k, _ in pool.items()] == [(1,), (4,)]


def test_get_of_missing_key_does_not_create_it():
    pool = NGramPool(max_keys=1)
    pool.add((1,), (2,))
    assert pool.get((7,), 3) == []
    assert pool.num_keys == 1 and pool.get((1,), 3) == [(2,)]


def test_add_ngrams():
    pool = NGramPool()
    tokens = [1, 2, 3, 1, 2, 4]
    pool.add_ngrams(tokens, key_len=1, cont_len=2)
    assert pool.get((1,), 5) == [(2, 4), (2, 3)]
    assert pool.get((2,), 5) == [(3, 1)]
    assert pool.get((3,), 5) == [(1, 2)]
    assert pool.get((4,), 5) == []
    assert len(pool) == 4  # 4 trigrams in 6 tokens


def test_add_ngrams_key_len_two_and_start():
    pool = NGramPool()
    tokens = [1, 2, 3, 1, 2, 5, 1, 2, 6]
    pool.add_ngrams(tokens, key_len=2, cont_len=1, start=3)
    assert pool.get((1, 2), 5) == [(6,), (5,)]  # (1, 2) -> 3 starts at 0 < start
    assert pool.get((2, 3), 5) == []
    pool.add_ngrams(tokens, key_len=2, cont_len=1, start=-4)  # negative start clamps to 0
    assert pool.get((1, 2), 5) == [(6,), (5,), (3,)]  # re-added in order: 6 is newest
    pool.add_ngrams([1, 2], key_len=2, cont_len=1)  # too short: nothing
    assert len(pool) == 7


def test_merge_pool_and_iterable():
    a = NGramPool(max_per_key=2)
    a.add((1,), (2,))
    b = NGramPool()
    b.add((1,), (3,))
    b.add((1,), (4,))
    b.add((5,), (6,))
    a.merge(b)
    # as if b's entries were added after a's, oldest first
    assert a.get((1,), 5) == [(4,), (3,)]
    assert a.get((5,), 5) == [(6,)]
    a.merge([((7, 7), [(8,), (9,)]), ([5], [[0]])])
    assert a.get((7, 7), 5) == [(9,), (8,)]
    assert a.get((5,), 5) == [(0,), (6,)]
    assert b.get((1,), 5) == [(4,), (3,)]  # the source is unchanged


def test_items_snapshot_order():
    pool = NGramPool()
    pool.add((1,), (2,))
    pool.add((3,), (4,))
    pool.add((1,), (5,))
    assert pool.items() == [((3,), [(4,)]), ((1,), [(2,), (5,)])]


@pytest.mark.parametrize("kwargs", [{"max_keys": 0}, {"max_per_key": 0}])
def test_bounds_validated(kwargs):
    with pytest.raises(ValueError):
        NGramPool(**kwargs)


def test_concurrent_adds_keep_bounds():
    pool = NGramPool(max_keys=50, max_per_key=4)

    def work(base):
        for i in range(2000):
            pool.add((base + i % 97,), (i % 13, i % 7))

    threads = [threading.Thread(target=work, args=(b,)) for b in range(0, 400, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.num_keys <= 50
    assert all(len(v) <= 4 for _, v in pool.items())


def test_journal_records_adds_not_merges_and_is_bounded():
    pool = NGramPool(journal_size=3)
    assert pool.journaling and not NGramPool().journaling
    pool.add((1,), (2,))
    pool.merge([((9,), [(9,)])], journal=False)  # pulled from elsewhere: not shipped back
    assert pool.drain_journal() == [((1,), (2,))]
    assert pool.drain_journal() == []
    pool.add_ngrams([1, 2, 3, 4, 5, 6], key_len=1, cont_len=1)  # 5 adds, the last 3 kept
    assert pool.drain_journal() == [((3,), (4,)), ((4,), (5,)), ((5,), (6,))]
    pool.merge([((7,), [(8,)])])  # a plain merge counts as adds
    assert pool.drain_journal() == [((7,), (8,))]
    assert NGramPool().drain_journal() == []
    with pytest.raises(ValueError):
        NGramPool(journal_size=-1)


def test_recent_gives_the_newest_entries_oldest_first():
    pool = NGramPool()
    pool.add((1,), (2,))
    pool.add((3,), (4,))
    pool.add((1,), (5,))  # key (1,) becomes most recent, (5,) its newest continuation
    assert pool.recent(10) == [((3,), (4,)), ((1,), (2,)), ((1,), (5,))]
    assert pool.recent(2) == [((1,), (2,)), ((1,), (5,))]
    assert pool.recent(0) == []
