"""Pins the transformers internals specserve.engine.hf_internals relies on (cache, attention
interface, quantizer)."""

from __future__ import annotations

import copy
import inspect

import peft
import pytest
import torch
from transformers import AttentionInterface, DynamicCache

from specserve.engine import hf_internals
from specserve.engine.forward.single import verify_forward
from specserve.engine.hf_internals import attention, backbone
from specserve.engine.tree import Draft, DraftTree

ATOL = 1e-5


@torch.inference_mode()
def _filled(model, tokens: list[int], growing: bool = False) -> DynamicCache:
    """A fresh cache holding `tokens`, computed by a plain causal forward."""
    cache = hf_internals.new_cache(model.config, growing=growing)
    model(
        input_ids=torch.tensor([tokens]),
        **hf_internals.cache_kwargs(model, cache),
        use_cache=True,
    )
    return cache


def _kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def _assert_same_cache(a, b):
    assert hf_internals.cache_length(a) == hf_internals.cache_length(b)
    for (ka, va), (kb, vb) in zip(_kv(a), _kv(b), strict=True):
        assert ka.shape == kb.shape
        assert torch.allclose(ka, kb, atol=ATOL), (ka - kb).abs().max()
        assert torch.allclose(va, vb, atol=ATOL), (va - vb).abs().max()


def test_dynamic_cache_layout(model):
    cfg = model.config
    cache = hf_internals.new_cache(cfg)
    assert isinstance(cache, DynamicCache)
    assert hf_internals.cache_length(cache) == 0
    cache = _filled(model, list(range(11)))
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    assert len(cache.layers) == cfg.num_hidden_layers
    for layer in cache.layers:
        assert layer.keys.shape == (1, cfg.num_key_value_heads, 11, head_dim)
        assert layer.values.shape == (1, cfg.num_key_value_heads, 11, head_dim)
    assert hf_internals.cache_length(cache) == 11


@pytest.mark.parametrize("growing", [False, True])
def test_crop_negative_removes_from_the_end(model, growing):
    cache = _filled(model, list(range(11)), growing)
    before = _kv(cache)
    cache.crop(-3)
    assert hf_internals.cache_length(cache) == 8
    for (k0, v0), layer in zip(before, cache.layers):
        assert layer.keys.shape[2] == 8
        assert torch.equal(layer.keys, k0[:, :, :8])
        assert torch.equal(layer.values, v0[:, :, :8])
    _assert_same_cache(cache, _filled(model, list(range(8))))


def test_cache_kwargs_picks_an_accepted_keyword(model):
    kwargs = hf_internals.cache_kwargs(model, "sentinel")
    assert len(kwargs) == 1
    ((name, value),) = kwargs.items()
    assert value == "sentinel"
    assert name in inspect.signature(type(model).forward).parameters
    assert name in {"cache", "past_key_values"}
    # and the model really writes into the cache passed that way
    cache = hf_internals.new_cache(model.config)
    with torch.inference_mode():
        model(
            input_ids=torch.tensor([[1, 2, 3]]),
            **hf_internals.cache_kwargs(model, cache),
            use_cache=True,
        )
        assert hf_internals.cache_length(cache) == 3
        model(
            input_ids=torch.tensor([[4]]), **hf_internals.cache_kwargs(model, cache), use_cache=True
        )
    assert hf_internals.cache_length(cache) == 4


@pytest.mark.parametrize("growing", [False, True])
def test_keep_rows_docstring_example(model, growing):
    cache = _filled(model, list(range(10)), growing)
    before = _kv(cache)
    hf_internals.keep_rows(cache, 6, [0, 2])
    assert hf_internals.cache_length(cache) == 8
    for (k0, v0), layer in zip(before, cache.layers):
        assert torch.equal(layer.keys[:, :, :7], k0[:, :, :7])
        assert torch.equal(layer.keys[:, :, 7], k0[:, :, 8])
        assert torch.equal(layer.values[:, :, 7], v0[:, :, 8])


@pytest.mark.parametrize("growing", [False, True])
@pytest.mark.parametrize("keep", [0, 1, 2, 4])
def test_keep_rows_contiguous_equals_recompute(model, keep, growing):
    tokens = [5, 9, 2, 77, 3, 3, 40, 8, 1, 60]
    cache = _filled(model, tokens, growing)
    hf_internals.keep_rows(cache, 6, list(range(keep)))
    _assert_same_cache(cache, _filled(model, tokens[: 6 + keep]))


def test_make_contiguous_gives_a_cropped_cache_its_own_storage(model):
    """A crop leaves strided views (which a compiled forward's guards see as another layout)."""
    tokens = [5, 9, 2, 77, 3, 3, 40, 8, 1, 60]
    cache = _filled(model, tokens)
    hf_internals.keep_rows(cache, 6, [0])
    assert not cache.layers[0].keys.is_contiguous()  # the crop's view: what this helper is for
    hf_internals.make_contiguous(cache)
    for layer in cache.layers:
        assert layer.keys.is_contiguous() and layer.values.is_contiguous()
    _assert_same_cache(cache, _filled(model, tokens[:7]))


def test_a_growing_cache_appends_in_place_and_equals_the_concatenating_one(model):
    """Decode steps write into the buffer's spare room (same storage, no copy of the entries
    before) and a crop keeps the buffer; the entries are those DynamicCache's cat gives."""
    tokens = [5, 9, 2, 77, 3, 3, 40, 8, 1, 60]
    growing, plain = _filled(model, tokens[:6], True), _filled(model, tokens[:6])
    storage = growing.layers[0].keys.untyped_storage().data_ptr()
    with torch.inference_mode():
        for t in tokens[6:]:
            for cache in (growing, plain):
                model(
                    input_ids=torch.tensor([[t]]),
                    **hf_internals.cache_kwargs(model, cache),
                    use_cache=True,
                )
    assert growing.layers[0].keys.untyped_storage().data_ptr() == storage
    _assert_same_cache(growing, plain)
    hf_internals.keep_rows(growing, 7, [])
    assert growing.layers[0].keys.untyped_storage().data_ptr() == storage
    _assert_same_cache(growing, _filled(model, tokens[:7]))


PREFIX = [7, 3, 19, 4, 50, 11, 3, 19]


@pytest.mark.parametrize(
    "chains, path_tokens",
    [
        ([[4, 5, 6], [8, 9]], [8, 9]),  # second branch: rows [3, 4]
        ([[4, 5], [4, 6, 7]], [4, 6, 7]),  # rows [0, 2, 3]
        ([[4, 5], [4, 6, 7]], [4, 5]),  # contiguous rows [0, 1] with other nodes after
        ([[1], [2], [3, 4]], [3]),  # a lone later sibling: rows [2]
        ([[1, 2]], []),  # nothing accepted
    ],
)
@pytest.mark.parametrize("with_aux", [False, True])
def test_keep_rows_after_tree_forward_equals_recompute(model, chains, path_tokens, with_aux):
    """After verifying a tree, keeping a root-to-node path gives the cache a plain forward over
    the committed tokens would have built (tree nodes got the right positions and context)."""
    from specserve.engine.proposers.lookahead import window_layout

    tree = DraftTree.from_chains(chains)
    aux = None
    if with_aux:
        from specserve.engine.tree import AuxBranch

        offsets, visible = window_layout(2, 2)
        aux = AuxBranch((9, 8, 7, 6), tuple(offsets), visible, (2, 3))
    rows, slot = [], 0
    for t in path_tokens:
        slot = next(c for c in tree.children[slot] if tree.tokens[c] == t) + 1
        rows.append(slot - 1)
    past_tokens, pending = PREFIX[:5], PREFIX[5:]
    cache = _filled(model, past_tokens)
    verify_forward(model, cache, len(past_tokens), pending, Draft(tree, aux))
    assert hf_internals.cache_length(cache) == len(PREFIX) + len(tree) + (len(aux) if aux else 0)
    hf_internals.keep_rows(cache, len(PREFIX), rows)
    _assert_same_cache(cache, _filled(model, PREFIX + path_tokens))


def test_strip_quantizer_makes_a_gguf_marked_model_savable(tmp_path, tiny_llama):
    """transformers refuses save_pretrained while a quantizer is attached (as after GGUF loading);
    strip_quantizer removes it and the saved config carries no quantization_config."""
    model = tiny_llama(seed=7, vocab=32, hidden=16, layers=1)
    model.config.quantization_config = {"quant_method": "gguf", "dequantize": False}
    hf_internals.strip_quantizer(model)
    assert not hasattr(model.config, "quantization_config")
    assert getattr(model, "hf_quantizer", None) is None
    model.save_pretrained(tmp_path)
    assert "quantization_config" not in (tmp_path / "config.json").read_text()


# --- hidden features and reused base-model parts (drafters) ---------------------------------


@torch.inference_mode()
def test_hidden_features_map_to_layer_outputs_and_the_normed_final(tiny_llama):
    model = tiny_llama(0, layers=3)
    ids = torch.tensor([[5, 9, 2, 7]])
    captured = []
    hooks = [
        layer.register_forward_hook(
            lambda m, i, o: captured.append(o[0] if isinstance(o, tuple) else o)
        )
        for layer in model.model.layers
    ]
    try:
        out = model(input_ids=ids, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    feats = hf_internals.hidden_features(out, (0, 1, -1))  # [1, 4, 3, H]
    assert feats.shape == (1, 4, 3, model.config.hidden_size)
    assert torch.allclose(feats[:, :, 0], captured[0], atol=ATOL)
    assert torch.allclose(feats[:, :, 1], captured[1], atol=ATOL)
    final = hf_internals.final_norm(model)(captured[2])
    assert torch.allclose(feats[:, :, 2], final, atol=ATOL)
    assert torch.allclose(model.lm_head(feats[:, :, 2]), out.logits, atol=ATOL)
    with pytest.raises(ValueError, match="valid are -1 and 0..1"):
        hf_internals.hidden_features(out, (2,))


@torch.inference_mode()
def test_fresh_decoder_layer_with_cache_equals_one_pass(tiny_llama):
    """The drafter's layer: the target's own class, rotary from the target, a 4D mask; two
    incremental calls over a cache equal one causal call."""
    model = tiny_llama(0)
    layer = hf_internals.decoder_layer(model)
    assert type(layer) is type(model.model.layers[0])
    x = torch.randn(1, 6, model.config.hidden_size)
    pos = torch.arange(6)[None]
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    mask = torch.zeros(6, 6).masked_fill_(~causal, torch.finfo(torch.float32).min)[None, None]
    one = hf_internals.layer_forward(layer, x, mask, pos, None, hf_internals.rotary(model, x, pos))
    cache = hf_internals.empty_cache()
    a = hf_internals.layer_forward(
        layer,
        x[:, :4],
        mask[..., :4, :4],
        pos[:, :4],
        cache,
        hf_internals.rotary(model, x[:, :4], pos[:, :4]),
    )
    assert hf_internals.cache_length(cache) == 4
    b = hf_internals.layer_forward(
        layer,
        x[:, 4:],
        mask[..., 4:, :],
        pos[:, 4:],
        cache,
        hf_internals.rotary(model, x[:, 4:], pos[:, 4:]),
    )
    assert hf_internals.cache_length(cache) == 6
    assert torch.allclose(torch.cat([a, b], dim=1), one, atol=ATOL)


def test_backbone_accessors_see_through_a_peft_wrapper(tiny_llama):
    import copy

    import peft

    from specserve.engine import hf_internals

    base = copy.deepcopy(tiny_llama(0))
    norm = hf_internals.final_norm(base)
    wrapped = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert hf_internals.final_norm(wrapped) is norm
    assert type(hf_internals.decoder_layer(wrapped)) is type(base.model.layers[0])


# --- batch rows: append_row / gather_rows ----------------------------------------------------


def test_append_row_to_an_empty_cache_copies_the_first_positions(model):
    """Appending to a fresh cache gives a 1-row cache with exactly the row's first `length`
    positions, not a view of the row's own tensors."""
    src = _filled(model, [5, 9, 2, 77, 3, 8])
    cache = hf_internals.new_cache(model.config)
    hf_internals.append_row(cache, src, 4)
    assert hf_internals.cache_length(cache) == 4
    for layer, s in zip(cache.layers, src.layers, strict=True):
        assert layer.keys.shape == (1, s.keys.shape[1], 4, s.keys.shape[3])
        assert torch.equal(layer.keys, s.keys[:, :, :4])
        assert torch.equal(layer.values, s.values[:, :, :4])
        assert layer.keys.data_ptr() != s.keys.data_ptr()
        assert layer.values.data_ptr() != s.values.data_ptr()


def test_append_row_pads_with_zeros_and_keeps_existing_rows(model):
    """Docstring example: [2 rows, 5 positions] + a row of 7 -> [3 rows, 7 positions]; a shorter
    row is zero-padded on the right, earlier rows stay bit-identical with zeros after them."""
    a = _filled(model, [1, 2, 3, 4, 5])
    b = _filled(model, [9, 8, 7, 6])
    c = _filled(model, [40, 41, 42, 43, 44, 45, 46, 47])
    cache = hf_internals.new_cache(model.config)
    hf_internals.append_row(cache, a, 5)
    hf_internals.append_row(cache, b, 3)  # shorter than the batch: padded to 5
    assert hf_internals.cache_length(cache) == 5
    for layer, sa, sb in zip(cache.layers, a.layers, b.layers, strict=True):
        assert layer.keys.shape[:3] == (2, sa.keys.shape[1], 5)
        assert torch.equal(layer.keys[0], sa.keys[0])
        assert torch.equal(layer.values[0], sa.values[0])
        assert torch.equal(layer.keys[1, :, :3], sb.keys[0, :, :3])
        assert torch.equal(layer.values[1, :, :3], sb.values[0, :, :3])
        assert not layer.keys[1, :, 3:].any() and not layer.values[1, :, 3:].any()
    before = _kv(cache)
    hf_internals.append_row(cache, c, 7)  # longer than the batch: everyone padded to 7
    assert hf_internals.cache_length(cache) == 7
    for layer, (k0, v0), sc in zip(cache.layers, before, c.layers, strict=True):
        assert layer.keys.shape[:3] == (3, k0.shape[1], 7)
        assert layer.values.shape == layer.keys.shape
        assert torch.equal(layer.keys[:2, :, :5], k0)
        assert torch.equal(layer.values[:2, :, :5], v0)
        assert not layer.keys[:2, :, 5:].any() and not layer.values[:2, :, 5:].any()
        assert torch.equal(layer.keys[2], sc.keys[0, :, :7])
        assert torch.equal(layer.values[2], sc.values[0, :, :7])
        assert layer.keys.dtype == sc.keys.dtype


def _three_row_cache(model):
    cache = hf_internals.new_cache(model.config)
    for tokens in ([1, 2, 3, 4], [11, 12, 13, 14, 15], [21, 22, 23, 24, 25, 26]):
        hf_internals.append_row(cache, _filled(model, tokens), len(tokens))
    return cache


def test_gather_rows_docstring_example(model):
    """rows [2, 0], columns [[0, 3], [1, 1]]: old row 2's positions 0, 3, then old row 0's
    position 1 twice, equal to manual indexing of the old tensors."""
    cache = _three_row_cache(model)
    before = _kv(cache)
    hf_internals.gather_rows(cache, torch.tensor([2, 0]), torch.tensor([[0, 3], [1, 1]]))
    assert hf_internals.cache_length(cache) == 2
    for layer, (k0, v0) in zip(cache.layers, before, strict=True):
        assert layer.keys.shape == (2, k0.shape[1], 2, k0.shape[3])
        for new, old in ((layer.keys, k0), (layer.values, v0)):
            assert torch.equal(new[0, :, 0], old[2, :, 0])
            assert torch.equal(new[0, :, 1], old[2, :, 3])
            assert torch.equal(new[1, :, 0], old[0, :, 1])
            assert torch.equal(new[1, :, 1], old[0, :, 1])
        assert not torch.equal(layer.keys[0, :, 0], layer.keys[1, :, 0])  # rows really differ


def test_gather_rows_matches_fancy_indexing(model):
    """Any rows / columns: new[i, :, j] == old[rows[i], :, columns[i, j]] for keys and values."""
    cache = _three_row_cache(model)
    before = _kv(cache)
    rows = torch.tensor([1, 2, 1])
    columns = torch.tensor([[4, 0, 2, 2], [5, 5, 1, 0], [0, 1, 2, 3]])
    hf_internals.gather_rows(cache, rows, columns)
    assert hf_internals.cache_length(cache) == 4
    for layer, (k0, v0) in zip(cache.layers, before, strict=True):
        for new, old in ((layer.keys, k0), (layer.values, v0)):
            expected = torch.stack(
                [old[r][:, c] for r, c in zip(rows.tolist(), columns.tolist(), strict=True)]
            )
            assert torch.equal(new, expected)


def test_gather_rows_on_an_empty_cache_is_a_no_op(model):
    """A fresh cache has nothing to gather and stays empty."""
    cache = hf_internals.new_cache(model.config)
    hf_internals.gather_rows(cache, torch.tensor([0]), torch.zeros(1, 0, dtype=torch.long))
    assert hf_internals.cache_length(cache) == 0


def test_growing_layer_cache_matches_dynamic_cache_and_grows_geometrically(tiny_llama):
    """A batch cache of GrowingLayers gives the model the same keys/values as DynamicCache
    over many steps, while reallocating only when its spare capacity runs out."""
    model = tiny_llama(0)
    ids = torch.randint(0, 96, (3, 40))
    plain, growing = (
        hf_internals.new_cache(model.config),
        hf_internals.new_batch_cache(model.config),
    )
    assert all(type(layer) is hf_internals.GrowingLayer for layer in growing.layers)
    reallocations, last = 0, None
    for start in range(0, 40, 4):
        chunk = ids[:, start : start + 4]
        a = model(input_ids=chunk, **hf_internals.cache_kwargs(model, plain), use_cache=True)
        b = model(input_ids=chunk, **hf_internals.cache_kwargs(model, growing), use_cache=True)
        torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=0)
        buffer = growing.layers[0]._k.data_ptr()
        reallocations += buffer != last
        last = buffer
    assert hf_internals.cache_length(growing) == 40 and reallocations <= 2
    torch.testing.assert_close(growing.layers[1].keys, plain.layers[1].keys, rtol=0, atol=0)


def test_growing_layer_writes_each_row_at_its_own_column():
    """With `set_write_columns`, row b's q new entries land at [start_b, start_b + q), the used
    part becomes max(start) + q and the rest of each row is untouched; equal starts take the
    one-slice path; `row_writes` holds for a batch cache of GrowingLayers only."""
    cache = DynamicCache()
    cache.layers = [hf_internals.GrowingLayer()]
    first = torch.randn(2, 1, 5, 3)
    cache.update(first, first + 1, 0)
    assert hf_internals.row_writes(cache)
    hf_internals.set_write_columns(cache, [2, 5])
    new = torch.randn(2, 1, 2, 3)
    keys, values = cache.update(new, new + 1, 0)
    assert keys.shape == (2, 1, 7, 3)
    assert torch.equal(keys[0, :, :2], first[0, :, :2]) and torch.equal(keys[0, :, 2:4], new[0])
    assert torch.equal(keys[0, :, 4:5], first[0, :, 4:5])
    assert torch.equal(keys[1, :, :5], first[1]) and torch.equal(keys[1, :, 5:7], new[1])
    assert torch.equal(values[1, :, 5:7], new[1] + 1)
    hf_internals.set_write_columns(cache, [1, 1])
    keys, _ = cache.update(new, new, 0)
    assert keys.shape[2] == 3 and torch.equal(keys[:, :, 1:3], new)
    assert not hf_internals.row_writes(hf_internals.new_cache(_model_config()))


def _model_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip


def test_row_attention_gets_row_extents_through_the_model_and_a_peft_wrapper(tiny_llama):
    """`row_extents` passed to the model's forward reaches the attention function of every
    layer (also through peft), and the row-wise result equals transformers' sdpa on the same
    4D mask; without a mask the function is transformers' sdpa itself."""
    model = copy.deepcopy(tiny_llama(0))
    model.set_attn_implementation("sdpa")  # the shared model may have been switched already
    plain = copy.deepcopy(model)
    assert hf_internals.enable_row_attention(model)
    assert model.config._attn_implementation == hf_internals.ROW_ATTENTION
    seen = []
    real = attention._row_attention

    def spy(*args, row_extents=None, **kwargs):
        seen.append(row_extents)
        return real(*args, row_extents=row_extents, **kwargs)

    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    mask = torch.zeros(2, 1, 4, 4)
    mask[:, :, torch.ones(4, 4, dtype=torch.bool).triu(1)] = torch.finfo(torch.float32).min
    mask[1, :, 2:, 0] = torch.finfo(torch.float32).min  # row 1's later queries skip column 0
    AttentionInterface.register(hf_internals.ROW_ATTENTION, spy)
    try:
        with torch.inference_mode():
            rows = model(input_ids=ids, attention_mask=mask, row_extents=[4, 4]).logits
            unmasked = model(input_ids=ids).logits
            lora = peft.LoraConfig(r=2, target_modules=["q_proj"])
            peft.get_peft_model(model, lora)(input_ids=ids, attention_mask=mask, row_extents=[3, 4])
    finally:
        AttentionInterface.register(hf_internals.ROW_ATTENTION, real)
    assert seen == [[4, 4], [4, 4], None, None, [3, 4], [3, 4]]  # 2 layers per forward
    with torch.inference_mode():
        reference = plain(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(rows, reference, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(unmasked, plain(input_ids=ids).logits, rtol=0, atol=0)


def test_enable_row_attention_leaves_other_implementations_alone(tiny_llama):
    """An eager model is not switched (the batch path still works through its mask)."""
    model = copy.deepcopy(tiny_llama(0))
    model.set_attn_implementation("eager")
    assert not hf_internals.enable_row_attention(model)
    assert model.config._attn_implementation == "eager"


def test_grouped_sdpa_equals_transformers_sdpa_on_a_masked_gqa_batch(tiny_llama):
    """The CPU path (torch's grouped-query sdpa) and the path other devices take (transformers'
    sdpa) agree on a masked batch with 2 query heads per key/value head, row by row or whole."""
    module = tiny_llama(0).model.layers[0].self_attn
    assert module.num_key_value_groups == 2
    g = torch.Generator().manual_seed(0)
    query = torch.randn(3, 4, 2, 16, generator=g)
    key, value = torch.randn(3, 2, 7, 16, generator=g), torch.randn(3, 2, 7, 16, generator=g)
    mask = torch.zeros(3, 1, 2, 7)
    mask[0, :, :, 5:] = mask[1, :, 0, 3] = torch.finfo(torch.float32).min
    ours = attention._grouped_sdpa(module, query, key, value, mask, scaling=0.25)
    theirs = attention._transformers_sdpa(module, query, key, value, mask, scaling=0.25)
    assert ours.shape == (3, 2, 4, 16)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    by_row, _ = attention._row_attention(
        module, query, key, value, mask, row_extents=[5, 7, 7], scaling=0.25
    )
    torch.testing.assert_close(by_row, theirs, rtol=1e-5, atol=1e-6)


# --- sliding-window layers (model families) ---


def _windowed_config(window: int = 4):
    from transformers import Gemma2Config

    return Gemma2Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=window,
        layer_types=["sliding_attention", "full_attention"],
    )


def test_layer_windows_read_the_configs_layer_types():
    from transformers import Llama4TextConfig, LlamaConfig, MistralConfig

    assert hf_internals.layer_windows(_windowed_config(4)) == (4, None)
    assert hf_internals.layer_windows(LlamaConfig(num_hidden_layers=2)) == (None, None)
    assert hf_internals.layer_windows(MistralConfig(num_hidden_layers=2, sliding_window=6)) == (
        6,
        6,
    )
    assert hf_internals.window(_windowed_config(4)) == 4
    chunked = Llama4TextConfig(num_hidden_layers=4)  # transformers caches chunks as windows
    with pytest.raises(ValueError, match="chunked_attention"):
        hf_internals.layer_windows(chunked)


def test_layer_masks_one_tensor_per_type_or_the_hybrid_mapping():
    from transformers import LlamaConfig, MistralConfig

    full, windowed = torch.zeros(1, 1, 2, 5), torch.ones(1, 1, 2, 3)
    assert hf_internals.layer_masks(LlamaConfig(num_hidden_layers=2), full, None) is full
    mistral = MistralConfig(num_hidden_layers=2, sliding_window=3)
    assert hf_internals.layer_masks(mistral, full, windowed) is windowed
    both = hf_internals.layer_masks(_windowed_config(), full, windowed)
    assert both == {"full_attention": full, "sliding_attention": windowed}


def _entries(n: int, start: int = 0) -> torch.Tensor:
    """[1, 1, n, 1] whose values are their positions start..start + n - 1."""
    return torch.arange(start, start + n, dtype=torch.float32).view(1, 1, n, 1)


def test_window_layer_docstring_example_and_mask_sizes():
    layer = hf_internals.WindowLayer(4)
    keys, _ = layer.update(_entries(10), _entries(10))
    assert keys.shape[2] == 10 and layer.get_seq_length() == 10
    layer.trim()
    assert (layer.offset, layer.held(), layer.get_seq_length()) == (7, 3, 10)
    assert layer.keys.flatten().tolist() == [7.0, 8.0, 9.0]
    assert layer.get_mask_sizes(2) == (5, 7)  # 3 held + 2 new keys, the first at position 7
    keys, _ = layer.update(_entries(2, 10), _entries(2, 10))
    assert keys.flatten().tolist() == [7.0, 8.0, 9.0, 10.0, 11.0]  # a forward sees all of it


def test_keep_rows_on_window_layers_equals_a_full_cache_cut_to_the_window():
    """Slow reference: the same steps on full-attention layers, then the last window - 1."""
    window = 4
    cache = hf_internals.new_cache(_windowed_config(window))
    reference = DynamicCache()
    total = 0
    rng = torch.Generator().manual_seed(0)
    for step in range(8):
        q = int(torch.randint(1, 6, (1,), generator=rng))
        kept = sorted(
            torch.randperm(q, generator=rng)[
                : int(torch.randint(0, q + 1, (1,), generator=rng))
            ].tolist()
        )
        new = _entries(q, 100 * step)
        for i in range(2):
            cache.layers[i].update(new, new)
            reference.update(new, new, i)
        hf_internals.keep_rows(cache, total, kept)
        hf_internals.keep_rows(reference, total, kept)
        total += len(kept)
        assert hf_internals.cache_length(cache) == total == hf_internals.cache_length(reference)
        full = reference.layers[0].keys.flatten().tolist()
        assert cache.layers[0].keys.flatten().tolist() == full[-(window - 1) :]
        assert (
            cache.layers[1].keys.flatten().tolist() == reference.layers[1].keys.flatten().tolist()
        )


def test_append_row_takes_a_window_layers_held_positions_into_its_layers_only():
    config = _windowed_config(4)
    row = hf_internals.new_cache(config)
    for layer in row.layers:
        layer.update(_entries(9), _entries(9))
    hf_internals.keep_rows(row, 9, [])  # trims the window layer to positions 6, 7, 8
    batch = hf_internals.new_batch_cache(config)
    hf_internals.append_row(batch, row, 9, layers=[0], first=6)
    hf_internals.append_row(batch, row, 9, layers=[1])
    assert batch.layers[0].keys.flatten().tolist() == [6.0, 7.0, 8.0]
    assert batch.layers[1].keys.flatten().tolist() == _entries(9).flatten().tolist()
    with pytest.raises(ValueError, match="holding 6 on"):  # what the window dropped is gone
        hf_internals.append_row(batch, row, 9, layers=[0], first=5)


@pytest.mark.parametrize(("keyword", "value"), [("softcap", 50.0), ("s_aux", torch.zeros(2))])
def test_row_attention_refuses_a_keyword_it_does_not_implement(tiny_llama, keyword, value):
    module = tiny_llama(0).model.layers[0].self_attn
    q = k = v = torch.zeros(1, 4, 3, 16)
    mask = torch.zeros(1, 1, 3, 3)
    with pytest.raises(hf_internals.UnsupportedAttention, match=keyword):
        attention._row_attention(module, q, k, v, mask, scaling=0.25, **{keyword: value})
    out, _ = attention._row_attention(module, q, k, v, mask, scaling=0.25, sliding_window=8)
    assert out.shape == (1, 3, 4, 16)


def test_backbone_accessors_on_gpt_neox():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXLayer

    config = GPTNeoXConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    model = GPTNeoXForCausalLM(config).eval()
    assert hf_internals.final_norm(model) is model.gpt_neox.final_layer_norm
    assert isinstance(hf_internals.decoder_layer(model), GPTNeoXLayer)
    assert backbone._layer_cache_keyword(GPTNeoXLayer) == "layer_past"
