"""THE GATE for one request, one output in bf16: with the position-invariant attention (where the
probe finds the kernels row-invariant) every strategy, alone or in random batches beside other
variants, commits bit for bit what the engine's own bf16 `ar` commits, greedy and seeded; the
attention against a slow reference; the same schedules on the old layout differ.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.nn.functional as F
from schedules import ADAPTERS, alone, prompt, requests, run, with_adapters

from specserve.engine import hf_internals, row_tiles
from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.decode.engine import Engine
from specserve.engine.drafters.modules import EagleSpec, MedusaSpec
from specserve.engine.forward import invariance
from specserve.engine.hf_internals.invariant_plan import (
    CALL_COST,
    TAIL,
    flash_calls,
    split_point,
)

pytestmark = pytest.mark.timeout(600)


def _reference(query, keys, values, allowed, scale):
    """Slow reference: each query row's softmax over its allowed keys, in float64."""
    group = query.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)  # [b, H, columns, d]
    v = values.double().repeat_interleave(group, dim=1)
    scores = query.double() @ k.transpose(2, 3) * scale  # [b, H, q, columns]
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)  # [b, q, H, d]


def _tree_case(gen, dtype, past=150, heads=6, kv_heads=2, d=32):
    """Two batch rows: a tree (root, two siblings, a grandchild) after `past` held positions, and
    a row of 40 held positions decoding one token."""
    columns = past + 4
    keys = torch.randn(2, kv_heads, columns, d, generator=gen).to(dtype)
    values = torch.randn(2, kv_heads, columns, d, generator=gen).to(dtype)
    query = torch.randn(2, heads, 4, d, generator=gen).to(dtype)
    allowed = torch.zeros(2, 4, columns, dtype=torch.bool)
    allowed[0, :, :past] = True
    for row, seen in enumerate([[0], [0, 1], [0, 2], [0, 1, 3]]):
        allowed[0, row, [past + s for s in seen]] = True
    allowed[1, :, :40] = True
    allowed[1, 0, 40] = True  # its one real query row; the rest are padding seeing themselves
    for row in range(1, 4):
        allowed[1, row, 40 + row] = True
    positions = torch.tensor([[past, past + 1, past + 1, past + 2], [40, 40, 40, 40]])
    return query, keys, values, allowed, positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_invariant_attention_equals_the_slow_reference(dtype):
    gen = torch.Generator().manual_seed(0)
    query, keys, values, allowed, positions = _tree_case(gen, dtype)
    layout = hf_internals.invariant_layout(allowed, positions, 3, dtype, "cpu")
    got = hf_internals.invariant_attention(None, query, keys, values, layout, 0.125)
    want = _reference(query, keys, values, allowed, 0.125)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.double()[0], want[0], atol=tol)
    assert torch.allclose(got.double()[1, :1], want[1, :1], atol=tol)


def test_split_point_worked_example():
    got = split_point(torch.tensor([0, 40, 63, 64, 100, 500]))
    assert got.tolist() == [0, 0, 0, 32, 64, 448]
    assert TAIL == 64


def test_a_row_deeper_than_the_tail_is_refused():
    allowed = torch.ones(1, 1, 200, dtype=torch.bool)
    allowed[0, 0, 100:130] = False  # positions 100.. are not held: the row sits 70 past them
    with pytest.raises(hf_internals.DraftTooDeep):
        hf_internals.invariant_layout(allowed, torch.tensor([[199]]), 1, torch.float32, "cpu")


def test_flash_calls_worked_example():
    assert flash_calls([300, 300, 0, 32, 800], 3) == [(0, 2, 300), (3, 4, 32), (4, 5, 800)]
    assert flash_calls([300] * 16, 3) == [(0, 16, 300)]
    assert flash_calls([0, 0], 3) == []


def _slow_flash_calls(widths, head_rows):
    """Every partition of the rows into runs, by brute force: the least cost."""
    n, best = len(widths), None
    for cuts in range(2 ** (n - 1)):
        ends = [i + 1 for i in range(n - 1) if cuts >> i & 1] + [n]
        starts, cost = [0, *ends[:-1]], 0
        for a, e in zip(starts, ends, strict=True):
            w = max(widths[a:e])
            cost += CALL_COST + (e - a) * head_rows * w if w else 0
        best = cost if best is None else min(best, cost)
    return best


def test_flash_calls_are_the_cheapest_partition():
    rng = random.Random(0)
    for _ in range(30):
        widths = [rng.choice([0, 32, 64, 288, 800]) for _ in range(rng.randint(1, 7))]
        calls = flash_calls(widths, 9)
        cost = sum(CALL_COST + (e - a) * 9 * w for a, e, w in calls)
        assert cost == _slow_flash_calls(widths, 9)
        assert all(w == max(widths[a:e]) for a, e, w in calls)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_sharing_a_flash_call_equal_rows_alone(dtype):
    """Batch rows of many lengths, in whatever calls the layout groups them: each row's output
    is bit-identical to that row alone."""
    _skip_unless_invariant_here(dtype)
    gen = torch.Generator().manual_seed(1)
    lengths = [300, 310, 40, 290, 700, 64, 305]
    columns = max(lengths) + 1
    keys = torch.randn(len(lengths), 3, columns, 64, generator=gen).to(dtype)
    values = torch.randn(len(lengths), 3, columns, 64, generator=gen).to(dtype)
    query = torch.randn(len(lengths), 9, 1, 64, generator=gen).to(dtype)
    allowed = torch.arange(columns)[None, None, :] <= torch.tensor(lengths)[:, None, None]
    positions = torch.tensor(lengths)[:, None]
    layout = hf_internals.invariant_layout(allowed, positions, 3, dtype, "cpu")
    assert len(layout.flash_calls) < len(lengths)  # some rows do share a call
    got = hf_internals.invariant_attention(None, query, keys, values, layout, 0.125)
    for row, length in enumerate(lengths):
        one = hf_internals.invariant_layout(
            allowed[row : row + 1], positions[row : row + 1], 3, dtype, "cpu"
        )
        alone = hf_internals.invariant_attention(
            None, query[row : row + 1], keys[row : row + 1], values[row : row + 1], one, 0.125
        )
        assert torch.equal(got[row], alone[0]), (row, length)


def _skip_unless_invariant_here(dtype) -> None:
    """The bitwise claims hold where the probe finds this machine's kernels invariant (the
    engine keeps the tie contract elsewhere and says so)."""
    if not invariance.attention_invariant(9, 3, 64, dtype):
        pytest.skip(f"{dtype} flash attention is not invariant to layout on this machine")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_prefix_gives_one_output_in_every_layout(dtype):
    """Alone, as a tree row after a masked sibling, beside a longer batch row: bit-identical,
    with grouped heads (G = 3) and without (G = 1)."""
    _skip_unless_invariant_here(dtype)
    assert invariance.attention_invariant(4, 4, 16, dtype)


def test_the_probe_reports_float32_and_bfloat16_here(tiny_llama):
    report = invariance.probe(copy.deepcopy(tiny_llama(1)).bfloat16())
    assert report.dtype == "torch.bfloat16" and report.reason
    fp32 = invariance.probe(tiny_llama(1))
    assert fp32.dtype == "torch.float32" and fp32.reason


def test_row_tile_pads_or_tiles_only_the_shapes_that_vary(monkeypatch):
    """Shape -> (first varying rows unpadded, padded to 2); None: never."""
    first = {(1536, 576): (2, None), (576, 1536): (None, None), (576, 576): (None, None)}

    def fake(in_f, out_f, dtype, rows, pad=1):
        m = first[(in_f, out_f)][pad - 1]
        return m if m is not None and m <= max(rows) else None

    monkeypatch.setattr(invariance, "first_variant_rows", fake)
    shapes = tuple(sorted(first))
    tiles = invariance.row_tile(shapes, torch.bfloat16)  # a Zen 4: pad 1-row products to 2
    assert tiles == invariance.RowTiles(pad=2, untiled=((576, 576), (576, 1536)))
    assert "padded to 2 (1 of 3 shapes" in invariance._how(tiles, 3)
    first[(1536, 576)] = (6, 6)  # varies above 5 rows either way: tiles of 4, unpadded
    assert invariance.row_tile(shapes, torch.bfloat16).tile == 4
    assert invariance.row_tile(shapes, torch.bfloat16).pad == 1
    first[(1536, 576)] = (2, 9)  # padded, invariant up to 8 rows
    assert invariance.row_tile(shapes, torch.bfloat16) == invariance.RowTiles(
        pad=2, tile=8, untiled=((576, 576), (576, 1536))
    )
    first[(1536, 576)] = (None, None)
    assert invariance.row_tile(shapes, torch.bfloat16) == invariance.RowTiles()
    first[(1536, 576)] = (2, 2)
    assert invariance.row_tile(shapes, torch.bfloat16).tile == 0


def _slow_first_variant(in_f, out_f, dtype, rows, pad):
    """The reference: each row's product padded to `pad` rows, every M >= pad, both scales."""
    for scale in invariance.SCALES:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(out_f, in_f, generator=gen).to(dtype)
        x = (torch.randn(max(rows), in_f, generator=gen) * scale).to(dtype)
        for m in rows:
            for i in range(m if m >= pad else 0):
                alone = torch.cat([x[i : i + 1], torch.zeros(pad - 1, in_f, dtype=dtype)])
                if not torch.equal(F.linear(x[:m], w)[i], F.linear(alone, w)[0]):
                    return m
    return None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pad", [1, 2])
def test_first_variant_rows_equals_the_slow_reference(dtype, pad):
    rows = (1, 2, 3, 5, 9, 17)
    for in_f, out_f in ((24, 8), (64, 16)):
        want = _slow_first_variant(in_f, out_f, dtype, rows, pad)
        assert invariance.first_variant_rows(in_f, out_f, dtype, rows, pad) == want


@pytest.fixture(scope="module")
def tiled_engine(tiny_llama, tokenizer, random_drafter):
    """The invariant engine with its linears in 32-row tiles and prompts in aligned 64-row
    tiles and 256-row blocks, as on a CPU whose bf16 kernel changes path above 32 rows (the tiny model's does not)."""
    model = with_adapters(copy.deepcopy(tiny_llama(1, init_range=0.1)).bfloat16(), ADAPTERS)
    row_tiles.tile_linears(model, 32)
    drafters = {
        "medusa": random_drafter(model, MedusaSpec(heads=2, topk=4), seed=2, scale=0.1),
        "eagle": random_drafter(model, EagleSpec(feature_layers=(0, -1)), seed=3, scale=0.1),
    }
    engine = Engine(model, tokenizer, frozenset(), drafters=drafters)
    if not engine.invariance.invariant:
        pytest.skip(f"this machine's kernels are not row-invariant: {engine.invariance.reason}")
    assert engine.tiled and engine.min_prefill == row_tiles.BLOCK_TILE
    return engine


@pytest.mark.parametrize("seed", [3, 4])
def test_bf16_row_tiled_batches_equal_ar_alone(tiled_engine, seed):
    """Prompts up to 530 tokens prefilled in aligned chunks beside others (a leftover budget
    waits for a tile boundary; 256-row prompt blocks are never cut), n-gram strategies and
    drafters: each equals its `ar` alone."""
    engine = tiled_engine
    reqs = [r | {"cancel_at": None} for r in requests(seed, 10)]
    rng = random.Random(seed)
    for req in reqs[::2]:
        req["prompt"] = prompt(rng, rng.choice([63, 64, 65, 129, 140, 300, 530]))
    scheduler = Scheduler(engine, BatchSettings(max_batch=6, prefill_chunk=100))
    seen = run(engine, scheduler, reqs)
    for i, req in enumerate(reqs):
        assert seen[i]["ids"] == _ar_alone(engine, req), (i, req["strategy"], req["adapter"])


def test_aligned_chunks_and_rows_worked_examples():
    assert row_tiles.aligned_chunk(0, 300, 700) == 256 and row_tiles.aligned_chunk(0, 40, 700) == 0
    assert row_tiles.aligned_chunk(0, 200, 700) == 0  # it would cut the block 0..255
    assert row_tiles.aligned_chunk(0, 200, 250) == 192  # no block: the prompt ends before 256
    assert row_tiles.aligned_chunk(512, 100, 700) == 64  # 512..767 is no block of this prompt
    assert row_tiles.aligned_rows(128, 150) == 128 and row_tiles.aligned_rows(100, 150) == 0
    assert row_tiles.prompt_cuts(192, 384) == [0, 64, 320]
    assert row_tiles.prompt_cuts(0, 128) == [0, 64]
    plan = row_tiles.TilePlan(32, rows=150, aligned=128)
    x, w = torch.randn(1, 150, 8), torch.randn(4, 8)
    assert torch.allclose(row_tiles.linear(x, w, plan=plan), x @ w.T, atol=1e-6)


@pytest.mark.parametrize("chunks", [[256, 256, 88], [512, 88], [256, 344]])
def test_prompt_blocks_give_each_row_one_value_whatever_the_chunking(chunks):
    """A 600-token prompt's 576 -> 1536 projection in bf16, prefilled whole (blocks 0..255 and
    256..511, a 64-row tile, 22 rows in 32-row tiles) or in chunks that `aligned_chunk` allows:
    the same rows."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(1536, 576, generator=gen).bfloat16()
    x = torch.randn(1, 600, 576, generator=gen).bfloat16()

    def part(start: int, size: int) -> torch.Tensor:
        aligned = row_tiles.aligned_rows(start, size if start + size < 600 else size - 1)
        plan = row_tiles.TilePlan(32, rows=size, aligned=aligned, start=start)
        return row_tiles.linear(x[:, start : start + size], w, plan=plan)

    whole = part(0, 600)
    starts = [sum(chunks[:i]) for i in range(len(chunks))]
    for start, size in zip(starts[:-1], chunks[:-1], strict=True):  # every chunk end is allowed
        assert row_tiles.aligned_chunk(start, size, 599) == size
    assert torch.equal(
        whole, torch.cat([part(a, n) for a, n in zip(starts, chunks, strict=True)], 1)
    )


@pytest.fixture(scope="module")
def bf16_engines(tiny_llama, tokenizer, random_drafter):
    """(invariant engine, old-layout engine) over the same bf16 tiny Llama with three adapters."""
    model = with_adapters(copy.deepcopy(tiny_llama(1, init_range=0.1)).bfloat16(), ADAPTERS)
    drafters = {
        "medusa": random_drafter(model, MedusaSpec(heads=2, topk=4), seed=2, scale=0.1),
        "eagle": random_drafter(model, EagleSpec(feature_layers=(0, -1)), seed=3, scale=0.1),
    }
    engine = Engine(model, tokenizer, frozenset(), drafters=drafters)
    if not engine.invariance.invariant:
        pytest.skip(f"this machine's kernels are not row-invariant: {engine.invariance.reason}")
    old = with_adapters(copy.deepcopy(tiny_llama(1, init_range=0.1)).bfloat16(), ADAPTERS)
    old_drafters = {
        "medusa": random_drafter(old, MedusaSpec(heads=2, topk=4), seed=2, scale=0.1),
        "eagle": random_drafter(old, EagleSpec(feature_layers=(0, -1)), seed=3, scale=0.1),
    }
    return engine, Engine(old, tokenizer, frozenset(), drafters=old_drafters, invariant=False)


def _ar_alone(engine, req) -> list[int]:
    return alone(engine, req | {"strategy": "ar", "config": None})


@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_every_strategy_in_random_batches_equals_bf16_ar_alone(bf16_engines, seed):
    """Random schedules (6 strategies, 3 adapters + base, greedy and seeded, joins, prefill
    chunks): each request's ids equal its own `ar` decoded alone, bit for bit."""
    engine, _ = bf16_engines
    reqs = [r | {"cancel_at": None, "join_at": r["join_at"] // 4} for r in requests(seed, 24)]
    scheduler = Scheduler(engine, BatchSettings(max_batch=16, prefill_chunk=16))
    seen = run(engine, scheduler, reqs)
    for i, req in enumerate(reqs):
        assert seen[i]["ids"] == alone(engine, req), (i, req["strategy"], req["adapter"])
        assert seen[i]["ids"] == _ar_alone(engine, req), (i, req["strategy"], req["adapter"])
    assert seen[-1]["max_rows"] >= 8 and len({r["strategy"] for r in reqs}) >= 4


def test_bf16_warm_pool_and_every_strategy_alone_equal_ar(bf16_engines):
    """The same request again once its n-gram pool is warm (a different verify layout): same."""
    engine, _ = bf16_engines
    rng = random.Random(7)
    for strategy in ("prompt_lookup", "lookahead", "medusa", "eagle"):
        for temperature in (0.0, 0.8):
            req = {
                "prompt": prompt(rng, 30) * 2,
                "strategy": strategy,
                "adapter": "v2",
                "max_new": 24,
                "temperature": temperature,
                "seed": 5,
                "config": None,
            }
            want = _ar_alone(engine, req)
            assert alone(engine, req) == want, (strategy, temperature)
            assert alone(engine, req) == want, (strategy, temperature, "warm")


def _old_and_new(query, keys, values, allowed, positions):
    """One forward's attention through the plain row attention (sdpa over the mask) and the
    invariant one: [b, q, H, d] each."""
    mask = torch.zeros(allowed.shape, dtype=query.dtype).masked_fill(~allowed, float("-inf"))
    old = torch.nn.functional.scaled_dot_product_attention(
        query, keys, values, attn_mask=mask[:, None], enable_gqa=True
    ).transpose(1, 2)
    group = query.shape[1] // keys.shape[1]
    layout = hf_internals.invariant_layout(allowed, positions, group, query.dtype, "cpu")
    return old, hf_internals.invariant_attention(None, query, keys, values, layout, None)


def test_the_old_layout_breaks_what_the_gate_checks():
    """SmolLM2's attention shapes in bf16: a token decoded alone vs the same token as a tree row
    whose ancestors sit after a masked sibling. The plain sdpa differs between the two layouts
    on some of 20 prefixes; the invariant attention never does."""
    _skip_unless_invariant_here(torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    old_differ = 0
    for _ in range(20):
        length = int(torch.randint(200, 400, (1,), generator=gen))
        keys = torch.randn(1, 3, length + 1, 64, generator=gen).bfloat16()
        values = torch.randn(1, 3, length + 1, 64, generator=gen).bfloat16()
        query = torch.randn(1, 9, 1, 64, generator=gen).bfloat16()
        alone = torch.ones(1, 1, length, dtype=torch.bool)
        at = torch.tensor([[length - 1]])
        old_alone, new_alone = _old_and_new(
            query, keys[:, :, :length], values[:, :, :length], alone, at
        )
        order = [
            *range(length - 3),
            length,
            *range(length - 3, length),
        ]  # a sibling before the last 3
        tree = torch.ones(1, 1, length + 1, dtype=torch.bool)
        tree[0, 0, length - 3] = False
        old_tree, new_tree = _old_and_new(query, keys[:, :, order], values[:, :, order], tree, at)
        assert torch.equal(new_alone, new_tree)
        old_differ += not torch.equal(old_alone, old_tree)
    assert old_differ > 0


def test_aligned_prompt_tiles_give_each_row_one_value_whatever_the_chunking():
    """SmolLM2's 576 -> 1536 projection in bf16: prompt rows 0..139 through aligned 64-row
    tiles, prefilled whole or as chunks [0, 64) + [64, 140), give identical rows; one product
    over all 140 rows (no plan) need not (on AMX cores it does not)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(1536, 576, generator=gen).bfloat16()
    x = torch.randn(1, 140, 576, generator=gen).bfloat16()
    whole = row_tiles.linear(x, w, plan=row_tiles.TilePlan(32, rows=140, aligned=128))
    first = row_tiles.linear(x[:, :64], w, plan=row_tiles.TilePlan(32, rows=64, aligned=64))
    plan = row_tiles.TilePlan(32, rows=76, aligned=64, start=64)
    rest = row_tiles.linear(x[:, 64:], w, plan=plan)
    assert torch.equal(whole, torch.cat([first, rest], dim=1))
