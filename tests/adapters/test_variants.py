import pytest

from specserve.adapters.variants import PoolBook, VariantKey


def test_key_round_trip_and_order():
    key = VariantKey.parse("support-bot@3")
    assert key == VariantKey("support-bot", 3) and str(key) == "support-bot@3"
    assert VariantKey("a", 2) < VariantKey("a", 10)


@pytest.mark.parametrize("text", ["support-bot", "x@", "x@v2", "@3", "a.b@1", "x@0"])
def test_bad_keys_refused(text):
    with pytest.raises(ValueError):
        VariantKey.parse(text)


def test_pools_are_per_version_and_bounded():
    book = PoolBook(max_pools=2, max_keys=16)
    v1, v2 = VariantKey("s", 1), VariantKey("s", 2)
    book.pool(v1).add((1, 2), (3, 4))
    assert book.pool(v1).get((1, 2), 4) == [(3, 4)] and not book.pool(v2).get(
        (1, 2), 4
    )  # a new version starts cold
    assert book.pool(v1) is book.pool(v1) and book.pool(v1).max_keys == 16
    book.pool(None)  # the base model's pool; evicts v2, the least recently used
    assert book.keys() == [v1, None]


def test_peek_neither_creates_nor_touches():
    book = PoolBook(max_pools=4, journal_size=8)
    v1, v2 = VariantKey("s", 1), VariantKey("s", 2)
    assert book.peek(v1) is None and book.keys() == []
    book.pool(v1)
    book.pool(v2)
    assert book.peek(v1) is book.pool(v1)
    book.pool(v2)
    book.peek(v1)
    assert book.keys() == [v1, v2]  # peek left v1 least recent
    assert book.journaling and book.peek(v1).journaling and not PoolBook().journaling
