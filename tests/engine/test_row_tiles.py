"""Row tiles: a linear's product in tiles equals the whole product's rows, and the decoder
stack switches its linears to the tiled forward only for forwards that need it."""

import copy

import torch

from specserve.engine import row_tiles


def _tiled(module) -> bool:
    return "forward" in module.__dict__


def test_linear_in_tiles_worked_example():
    plan = row_tiles.TilePlan(32)
    x, w = torch.randn(2, 40, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)
    assert torch.allclose(row_tiles.linear(x, w, plan=plan), x @ w.T)


def test_the_stack_tiles_only_forwards_longer_than_a_tile(tiny_llama):
    model = copy.deepcopy(tiny_llama(1))
    plan = row_tiles.tile_linears(model, 4)
    inner = model.model.layers[0].self_attn.q_proj
    assert inner.row_plan is plan and model.lm_head.row_plan is plan
    assert _tiled(model.lm_head)  # outside the stack: always the tiled forward
    calls = []
    original = row_tiles.linear
    row_tiles.linear = lambda *a, **k: calls.append(a[0].shape) or original(*a, **k)
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2, 3]]))
            assert not _tiled(inner) and len(calls) == 1  # the head only
            calls.clear()
            model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]))
            assert _tiled(inner) and len(calls) > 1
            model.model(input_ids=torch.tensor([[1, 2]]))  # the stack alone decides too
            assert not _tiled(inner)
            with row_tiles.aligned_prompt(model, 2, 2, 0):  # aligned prompt rows always tile
                model(input_ids=torch.tensor([[1, 2]]))
                assert _tiled(inner)
    finally:
        row_tiles.linear = original


def test_tiled_and_untiled_forwards_agree(tiny_llama):
    model = copy.deepcopy(tiny_llama(1)).double()
    reference = copy.deepcopy(model)
    row_tiles.tile_linears(model, 2)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        for rows in (1, 5):
            got = model(input_ids=ids[:, :rows]).logits
            assert torch.allclose(got, reference(input_ids=ids[:, :rows]).logits)


def test_shapes_invariant_at_any_rows_stay_untiled(tiny_llama):
    """Only the linears whose shape the probe found varying run tiled; an untiled shape in
    another dtype than the probed one (an fp32 head over a bf16 model) is tiled all the same."""
    model = copy.deepcopy(tiny_llama(1)).bfloat16()
    layer = model.model.layers[0]
    down, q = layer.mlp.down_proj, layer.self_attn.q_proj
    shape = (down.in_features, down.out_features)
    assert shape != (q.in_features, q.out_features)
    untiled = frozenset(
        (m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)
    ) - {shape}
    model.lm_head.float()
    plan = row_tiles.tile_linears(model, 4, untiled, torch.bfloat16)
    assert down.row_plan is plan and not _tiled(q)
    assert row_tiles.row_plan(q) is plan  # its LoRA products (never probed) still follow it
    assert model.lm_head.row_plan is plan  # fp32 weights: not the probed dtype
    calls = []
    original = row_tiles.linear
    row_tiles.linear = lambda *a, **k: calls.append(tuple(a[1].shape)) or original(*a, **k)
    try:
        with torch.no_grad():
            model.model(input_ids=torch.tensor([[1, 2, 3, 4, 5, 6]]))
    finally:
        row_tiles.linear = original
    assert set(calls) == {(down.out_features, down.in_features)}  # [out, in] weights


def test_untiled_runs_every_product_whole_meanwhile(tiny_llama):
    model = copy.deepcopy(tiny_llama(1))
    plan = row_tiles.tile_linears(model, 2)
    calls = []
    original = row_tiles.linear
    row_tiles.linear = lambda *a, **k: calls.append(a[0].shape[-2]) or original(*a, **k)
    try:
        with torch.no_grad(), row_tiles.untiled(model):
            model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]))
            assert not _tiled(model.model.layers[0].self_attn.q_proj)
        assert plan.tile == 2 and calls == [5]  # the head, in one product of 5 rows
        with row_tiles.untiled(torch.nn.Linear(2, 2)):  # an untiled model: nothing to do
            pass
    finally:
        row_tiles.linear = original


def test_products_below_the_pad_run_padded_with_zero_rows(tiny_llama):
    """Worked example: 1 row, pad 2 -> one 2-row product, its first row kept; a 1-row forward of
    a padded model runs every tiled linear on 2 rows."""
    plan = row_tiles.TilePlan(row_tiles.WHOLE, pad=2)
    x, w = torch.randn(1, 1, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)
    assert torch.allclose(row_tiles.linear(x, w, plan=plan), x @ w.T)
    assert row_tiles.linear(x, w, plan=plan).shape == (1, 1, 4)
    model = copy.deepcopy(tiny_llama(1))
    reference = copy.deepcopy(model)
    row_tiles.tile_linears(model, row_tiles.WHOLE, pad=2)
    seen = []
    original = torch.nn.functional.linear
    torch.nn.functional.linear = lambda a, *r, **k: seen.append(a.shape[0]) or original(a, *r, **k)
    try:
        with torch.no_grad():
            got = model(input_ids=torch.tensor([[7]])).logits
    finally:
        torch.nn.functional.linear = original
    assert seen and set(seen) == {2}
    with torch.no_grad():
        assert torch.allclose(got, reference(input_ids=torch.tensor([[7]])).logits, atol=1e-6)
