"""specserve.engine.forward.batch_cache.BatchKV: rows of different lengths in one cache, visible columns,
ragged writes (each row after its own end) and the common-end layout, and compaction that keeps
every row's held key/value vectors."""

from __future__ import annotations

import pytest
import torch

from specserve.engine import hf_internals
from specserve.engine.forward.batch_cache import BatchKV, column_positions


@torch.inference_mode()
def _filled(model, tokens: list[int]):
    """A request's own cache holding `tokens` (plain causal forward)."""
    cache = hf_internals.new_cache(model.config)
    model(
        input_ids=torch.tensor([tokens]),
        **hf_internals.cache_kwargs(model, cache),
        use_cache=True,
    )
    return cache


@torch.inference_mode()
def _forward(kv: BatchKV, q: int, seed: int) -> tuple[list[int], list[torch.Tensor]]:
    """Stand-in for a batch forward: q random new entries for every row of every layer, written
    where `begin` says; returns the starts and each layer's new keys [b, h, q, d]."""
    starts = kv.begin(q)
    g = torch.Generator().manual_seed(seed)
    new_keys = []
    for i, layer in enumerate(kv.cache.layers):
        b, h, _, d = layer.keys.shape
        keys = torch.randn(b, h, q, d, generator=g)
        kv.cache.update(keys, torch.randn(b, h, q, d, generator=g), i)
        new_keys.append(keys)
    return starts, new_keys


def _snapshot(kv: BatchKV):
    return [(layer.keys.clone(), layer.values.clone()) for layer in kv.cache.layers]


def _assert_rows_hold(kv: BatchKV, held: list[list[int]], snapshot, old_rows: list[int]):
    """Row i of kv holds, left-packed, old row old_rows[i]'s columns held[old_rows[i]]."""
    assert kv.rows == len(old_rows)
    assert kv.lengths() == [len(held[r]) for r in old_rows]
    for (k0, v0), layer in zip(snapshot, kv.cache.layers, strict=True):
        for i, r in enumerate(old_rows):
            cols = torch.tensor(held[r], dtype=torch.long)
            n = len(held[r])
            assert torch.equal(layer.keys[i, :, :n], k0[r][:, cols])
            assert torch.equal(layer.values[i, :, :n], v0[r][:, cols])
            assert kv.visible[i, :n].all() and not kv.visible[i, n:].any()


def test_fresh_batch_is_empty(model):
    """A new BatchKV has no rows, no columns, no lengths and nothing wasted."""
    kv = BatchKV(model.config)
    assert kv.rows == 0 and kv.columns == 0 and kv.ends() == []
    assert kv.lengths() == [] and kv.wasted() == 0.0
    assert hf_internals.cache_length(kv.cache) == 0


def test_add_rows_of_different_lengths(model):
    """Each add returns the next index; visible marks each row's own prefix; the cache is as
    wide as the longest row and holds each request's first `length` positions."""
    kv = BatchKV(model.config)
    sources = [
        _filled(model, [1, 2, 3, 4, 5, 6]),
        _filled(model, list(range(20, 27))),
        _filled(model, [9, 9]),
    ]
    assert kv.add(sources[0], 4) == 0  # only the first 4 of its 6 positions
    assert kv.add(sources[1], 7) == 1
    assert kv.add(sources[2], 2) == 2
    assert (kv.rows, kv.columns) == (3, 7)
    assert kv.lengths() == [4, 7, 2]
    expected = torch.zeros(3, 7, dtype=torch.bool)
    expected[0, :4] = expected[1, :7] = expected[2, :2] = True
    assert torch.equal(kv.visible, expected)
    assert kv.wasted() == pytest.approx(0.0)
    assert hf_internals.cache_length(kv.cache) == 7
    for layer, *src in zip(kv.cache.layers, *(s.layers for s in sources), strict=True):
        for row, (s, n) in enumerate(zip(src, (4, 7, 2), strict=True)):
            assert torch.equal(layer.keys[row, :, :n], s.keys[0, :, :n])
            assert torch.equal(layer.values[row, :, :n], s.values[0, :, :n])


def test_common_end_hides_new_columns_until_keep(model):
    """Not ragged: a forward adds q hidden columns after the common end (wasted rises); keep
    holds columns of the last forward only, counted from that forward's first query row, packed
    right after the forward's start (their entries move there before the next forward)."""
    kv = BatchKV(model.config, ragged=False, pack=True)
    kv.add(_filled(model, [1, 2, 3, 4]), 4)
    kv.add(_filled(model, [5, 6]), 2)
    _forward(kv, 3, seed=0)
    assert (kv.rows, kv.columns) == (2, 7)
    assert hf_internals.cache_length(kv.cache) == 7
    assert kv.lengths() == [4, 2]
    assert kv.wasted() == pytest.approx(1 - 4 / 7)
    kept = kv.cache.layers[0].keys[0, :, 6].clone()  # row 0's forward column 2
    kv.keep(0, [0, 2])
    kv.keep(1, [1])
    assert kv.lengths() == [6, 3]
    assert kv.visible[0].tolist() == [True] * 4 + [True, True, False]
    assert kv.visible[1].tolist() == [True, True, False, False, True, False, False]
    assert kv.wasted() == pytest.approx(1 - 6 / 7)
    _forward(kv, 2, seed=1)  # a second forward: keep counts from its first column (7)
    assert torch.equal(kv.cache.layers[0].keys[0, :, 5], kept)  # packed before it ran
    kv.keep(1, [0])
    assert kv.visible[1, 7] and not kv.visible[1, 8] and not kv.visible[0, 7:].any()
    assert kv.lengths() == [6, 4]
    assert kv.wasted() == pytest.approx(1 - 6 / 9)
    assert kv.extents(2) is None  # every row attends every column


def test_ragged_rows_write_after_their_own_end(model):
    """Ragged: row b's new entries land at [ends()[b], ends()[b] + q); the cache is only as wide as
    the longest row's end + q; a row's rejected tail is overwritten by its next forward; kept
    columns pack right after the row's own (no holes); extents are start + q."""
    kv = BatchKV(model.config, pack=True)
    assert kv.ragged
    kv.add(_filled(model, [1, 2, 3, 4]), 4)
    kv.add(_filled(model, [5, 6]), 2)
    starts, new_keys = _forward(kv, 3, seed=0)
    assert starts == [4, 2] and kv.extents(3) == [7, 5]
    assert kv.columns == 7 == hf_internals.cache_length(kv.cache)
    for layer, keys in zip(kv.cache.layers, new_keys, strict=True):
        assert torch.equal(layer.keys[0, :, 4:7], keys[0])
        assert torch.equal(layer.keys[1, :, 2:5], keys[1])
    kv.keep(0, [0, 2])  # column 6's entry packs into column 5: no hole
    kv.keep(1, [0])  # columns 3, 4 rejected
    assert kv.ends() == [6, 3] and kv.lengths() == [6, 3]
    assert kv.wasted() == 0.0
    starts, newer_keys = _forward(kv, 2, seed=1)
    assert starts == [6, 3] and kv.columns == 8
    for layer, keys, newer in zip(kv.cache.layers, new_keys, newer_keys, strict=True):
        assert torch.equal(layer.keys[0, :, 5], keys[0, :, 2])  # packed before the forward
        assert torch.equal(layer.keys[1, :, 3:5], newer[1])  # over the rejected tail
    kv.keep(1, [0, 1])
    assert kv.visible[1].tolist() == [True] * 5 + [False] * 3
    assert kv.visible[0].tolist() == [True] * 6 + [False] * 2


def test_ragged_cache_narrows_when_the_longest_row_leaves(model):
    """Ragged: a released row's end is 0, so the next forward's used width follows the rows
    still held (the free row writes its padding at column 0)."""
    kv = BatchKV(model.config)
    kv.add(_filled(model, list(range(10))), 10)
    kv.add(_filled(model, [5, 6]), 2)
    kv.release(0)
    starts, _ = _forward(kv, 1, seed=0)
    assert starts == [0, 2] and kv.columns == 3 == hf_internals.cache_length(kv.cache)


def _busy_batch(model, ragged: bool):
    """Four rows of different lengths after two forwards with scattered keeps, a row added in
    between; returns the BatchKV and each row's held columns as tracked independently here."""
    kv = BatchKV(model.config, ragged=ragged)
    held: list[list[int]] = []
    for tokens in ([1, 2, 3], [4, 5, 6, 7, 8], [9, 10]):
        kv.add(_filled(model, tokens), len(tokens))
        held.append(list(range(len(tokens))))
    starts, _ = _forward(kv, 4, seed=2)
    for row, keep in ((0, [0, 1]), (1, [0, 3]), (2, [0])):
        kv.keep(row, keep)
        held[row] += [starts[row] + c for c in keep]
    kv.add(_filled(model, [30, 31, 32, 33]), 4)  # joins after the forward: columns 0..3
    held.append([0, 1, 2, 3])
    starts, _ = _forward(kv, 3, seed=3)
    for row, keep in ((0, [2]), (1, [0, 1, 2]), (2, [1]), (3, [0])):
        kv.keep(row, keep)
        held[row] += [starts[row] + c for c in keep]
    return kv, held


@pytest.mark.parametrize("ragged", [False, True], ids=["common-end", "ragged"])
def test_busy_batch_tracks_visible_and_lengths(model, ragged):
    """visible and lengths() match the columns each row was given, and wasted() the rest."""
    kv, held = _busy_batch(model, ragged)
    for row, cols in enumerate(held):
        assert kv.visible[row].nonzero().flatten().tolist() == cols
    assert kv.lengths() == [len(c) for c in held] == [6, 10, 4, 5]
    if ragged:  # row 1 held 0..4, wrote 5..8 (kept 5, 8), then 9..11 (kept all)
        assert kv.columns == 12 and kv.ends() == [8, 12, 5, 5]
        assert kv.wasted() == pytest.approx(1 - 25 / 30)
    else:
        assert kv.columns == 12
        assert kv.wasted() == pytest.approx(1 - 10 / 12)


@pytest.mark.parametrize("ragged", [False, True], ids=["common-end", "ragged"])
@pytest.mark.parametrize(
    "keep_rows",
    [[0, 1, 2, 3], [0, 2, 3], [3, 1], [2], [1, 0, 3, 2]],
    ids=["all", "drop-middle", "reorder", "one", "permute"],
)
def test_compact_keeps_each_rows_vectors(model, keep_rows, ragged):
    """After compact(keep_rows) row i holds, packed left and in order, exactly the key/value
    vectors old row keep_rows[i] attended before; nothing is wasted any more."""
    kv, held = _busy_batch(model, ragged)
    snapshot = _snapshot(kv)
    kv.compact(keep_rows)
    width = max(len(held[r]) for r in keep_rows)
    assert kv.columns == width == hf_internals.cache_length(kv.cache)
    _assert_rows_hold(kv, held, snapshot, keep_rows)
    assert kv.wasted() == pytest.approx(0.0)
    assert kv.ends() == [len(held[r]) for r in keep_rows]


@pytest.mark.parametrize("ragged", [False, True], ids=["common-end", "ragged"])
def test_compact_then_continue_then_compact_again(model, ragged):
    """A compacted batch keeps working: a new forward, keeps, an added row and a second
    compaction still leave every row holding its own vectors."""
    kv, held = _busy_batch(model, ragged)
    snap = _snapshot(kv)
    kv.compact([0, 2, 3])  # the middle-long row 1 leaves
    _assert_rows_hold(kv, held, snap, [0, 2, 3])
    held = [list(range(len(held[r]))) for r in (0, 2, 3)]  # new column numbering
    starts, _ = _forward(kv, 2, seed=4)
    kv.keep(0, [1])
    kv.keep(2, [0, 1])
    held[0].append(starts[0] + 1)
    held[2] += [starts[2], starts[2] + 1]
    assert kv.add(_filled(model, [50, 51, 52, 53, 54, 55, 56, 57, 58]), 9) == 3  # widens to 9
    held.append(list(range(9)))
    assert kv.columns == 9
    assert kv.lengths() == [len(c) for c in held]
    snap = _snapshot(kv)
    kv.compact([3, 1, 0])
    _assert_rows_hold(kv, held, snap, [3, 1, 0])


def test_compact_to_zero_rows_then_reuse(model):
    """compact([]) empties the batch (no rows, columns or cache); a later add starts afresh."""
    kv, _ = _busy_batch(model, ragged=True)
    kv.compact([])
    assert (kv.rows, kv.columns) == (0, 0)
    assert kv.lengths() == [] and kv.wasted() == 0.0
    assert hf_internals.cache_length(kv.cache) == 0
    src = _filled(model, [7, 8, 9])
    assert kv.add(src, 3) == 0
    assert (kv.rows, kv.columns) == (1, 3)
    for layer, s in zip(kv.cache.layers, src.layers, strict=True):
        assert layer.keys.shape[0] == 1
        assert torch.equal(layer.keys, s.keys[:, :, :3])
        assert torch.equal(layer.values, s.values[:, :, :3])


def test_column_positions_docstring_example():
    visible = torch.tensor([[True, False, True, False, False]])
    out = column_positions(visible, [3], torch.tensor([[2, 3]]))
    assert out.tolist() == [[0, 0, 1, 2, 3]]
    assert column_positions(visible, [3], torch.tensor([[2, 3]]), [5]).tolist() == [[5, 5, 6, 2, 3]]


def test_column_positions_of_held_columns_count_up_per_row():
    """Reference: a row's k-th held column (in column order) holds position k."""
    gen = torch.Generator().manual_seed(1)
    visible = torch.rand(3, 12, generator=gen) < 0.5
    starts = [12, 12, 12]  # every new block after the common end (not ragged)
    visible = torch.cat([visible, torch.zeros(3, 2, dtype=torch.bool)], 1)
    position_ids = torch.tensor([[5, 6], [7, 7], [1, 2]])
    out = column_positions(visible, starts, position_ids)
    for b in range(3):
        held = visible[b, :12].nonzero().flatten().tolist()
        assert [out[b, c].item() for c in held] == list(range(len(held)))
        assert out[b, 12:].tolist() == position_ids[b].tolist()


def _hybrid_model():
    from conftest import make_tiny_family

    return make_tiny_family("gemma2")  # layer 0 sliding (window 8), layer 1 full


def test_a_window_group_keeps_each_rows_last_window_positions():
    """Gemma 2: a full group (layer 1) and a window group (layer 0) with their own columns;
    rows join holding only what the window still sees, and compaction drops what it left."""
    model = _hybrid_model()
    kv = BatchKV(model.config)
    kv.add(_filled(model, list(range(20))), 20)
    kv.add(_filled(model, [3, 4, 5]), 3)
    full, windowed = kv.groups
    assert (full.layers, full.window, windowed.layers, windowed.window) == ((1,), None, (0,), 8)
    assert kv.lengths() == [20, 3] and windowed.offsets == [13, 0]
    assert (full.columns, windowed.columns) == (20, 7)
    assert kv.cache.layers[0].keys.shape[2] == 7 and kv.cache.layers[1].keys.shape[2] == 20
    for step in range(4):  # each row keeps 2 of 3 new columns
        _forward(kv, 3, seed=step)
        for row in range(2):
            kv.keep(row, [0, 2])
    assert kv.lengths() == [28, 11] and windowed.columns == 7 + 4 * 3
    snapshot = kv.cache.layers[0].keys.clone()
    held = [windowed.visible[r].nonzero().flatten()[-7:] for r in range(2)]
    kv.compact([1, 0])
    full, windowed = kv.groups
    assert kv.lengths() == [11, 28] and windowed.offsets == [4, 21]
    assert windowed.columns == 7 and full.columns == 28
    for i, r in enumerate([1, 0]):
        assert torch.equal(kv.cache.layers[0].keys[i], snapshot[r][:, held[r]])


def test_a_window_group_past_twice_its_window_is_trimmed_alone():
    """Only the window group is compacted (rows stay in place); the full group is untouched."""
    model = _hybrid_model()
    kv = BatchKV(model.config)
    kv.add(_filled(model, list(range(10))), 10)
    kv.add(_filled(model, [4, 5]), 2)
    kv.release(1)
    step = 0
    while not kv.groups[1].stale():
        _forward(kv, 2, seed=step)
        kv.keep(0, [0, 1])
        step += 1
    full_keys = kv.cache.layers[1].keys.data_ptr()
    lengths = kv.lengths()
    kv.trim_windows()
    assert kv.groups[1].columns == 7 and kv.rows == 2 and kv.free == [1]
    assert kv.lengths() == lengths and kv.cache.layers[1].keys.data_ptr() == full_keys
    assert not kv.groups[1].stale()
