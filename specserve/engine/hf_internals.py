"""Every touch of transformers internals lives here, pinned by tests/engine/test_hf_internals.py:
the KV cache (one entry per committed position; `keep_rows` keeps the accepted nodes' entries and
drops the rest; `GrowingLayer`, `append_row`, `write_row`, `gather_rows` hold a batch of requests'
caches, each row writing at its own column), the row-wise attention registered with transformers'
`AttentionInterface`, and the quantizer marker a GGUF-loaded model carries.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from collections.abc import Sequence

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer, get_layer_types_and_kwargs
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask


def new_cache(config) -> DynamicCache:
    """An empty cache for a model with this config; its sliding-window layers are `WindowLayer`s
    (they can roll back a rejected draft and keep only what a later query can see)."""
    cache = DynamicCache(config=config)
    cache.layers = [
        WindowLayer(window) if window else layer
        for layer, window in zip(cache.layers, layer_windows(config), strict=True)
    ]
    return cache


def layer_windows(config) -> tuple[int | None, ...]:
    """Per decoder layer: its sliding window (a query at position p sees keys at positions
    > p - window), or None for full attention. Example: Gemma 2 with window 4096 ->
    (4096, None, 4096, None, ...). Raises for cache layers the engine cannot roll back.
    Remembered per config object (building the layers costs ~0.5 ms; forwards ask every step)."""
    known = _WINDOWS.get(id(config))
    if known is not None and known[0]() is config:
        return known[1]
    windows = _layer_windows(config)
    _WINDOWS[id(config)] = (weakref.ref(config), windows)
    return windows


_WINDOWS: dict[int, tuple[weakref.ref, tuple[int | None, ...]]] = {}


def _layer_windows(config) -> tuple[int | None, ...]:
    layer_types, layer_kwargs = get_layer_types_and_kwargs(config)
    windows = []
    for i, (kind, kwargs) in enumerate(zip(layer_types, layer_kwargs, strict=True)):
        if kind == "sliding_attention":
            windows.append(int(kwargs["sliding_window"]))
        elif kind == "full_attention":
            windows.append(None)
        else:  # chunked attention (Llama 4), linear / recurrent states, shared KV...
            raise ValueError(
                f"layer {i} of {config.model_type} has {kind} layers; the engine serves full "
                "and sliding-window attention only"
            )
    if len({w for w in windows if w}) > 1:
        raise ValueError(f"{config.model_type}: layers with different sliding windows {windows}")
    return tuple(windows)


def window(config) -> int | None:
    """The sliding window of the model's windowed layers (None: every layer attends fully)."""
    return next((w for w in layer_windows(config) if w), None)


def layer_masks(config, full: torch.Tensor, windowed: torch.Tensor | None):
    """What the model's `attention_mask` argument takes for 4D masks per layer type: one tensor
    when every layer is of one type, else the {layer type: mask} mapping hybrid models read.
    `windowed` must be given when the model has sliding-window layers."""
    windows = layer_windows(config)
    if not any(windows):
        return full
    if all(windows):
        return windowed
    return {"full_attention": full, "sliding_attention": windowed}


def window_offset(cache: DynamicCache) -> int:
    """Positions the cache's windowed layers dropped from the front (0 without such layers)."""
    return next((layer.offset for layer in cache.layers if isinstance(layer, WindowLayer)), 0)


def cache_length(cache: DynamicCache) -> int:
    """Number of positions held."""
    return cache.get_seq_length()


def cache_kwargs(model, cache: DynamicCache) -> dict:
    """The forward keyword for the cache: `cache` in newer transformers, `past_key_values` before."""
    owner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wrapper
    return {_cache_keyword(type(owner)): cache}


@functools.cache
def _cache_keyword(model_type: type) -> str:
    params = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.inference_mode()
def keep_rows(cache: DynamicCache, start: int, rows: list[int]) -> None:
    """Keep positions [0, start) plus start + r for r in rows (ascending), in that order.

    Example: length 10, start 6, rows [0, 2] leaves length 8 holding positions 0..6 and 8.
    A `WindowLayer` then drops what no later query can see (all but its last window - 1).
    """
    total = cache_length(cache)
    contiguous = rows == list(range(len(rows)))
    for layer in cache.layers:
        offset = layer.offset if isinstance(layer, WindowLayer) else 0  # column = position - offset
        if not contiguous:
            src = torch.tensor([start + r - offset for r in rows], device=layer.keys.device)
            dst = slice(start - offset, start - offset + len(rows))
            layer.keys[:, :, dst] = layer.keys.index_select(2, src)
            layer.values[:, :, dst] = layer.values.index_select(2, src)
        drop = total - (start + len(rows))
        if drop > 0:
            layer.crop(-drop)
        if isinstance(layer, WindowLayer):
            layer.trim()


@torch.inference_mode()
def make_contiguous(cache: DynamicCache) -> None:
    """Copy each layer's entries that a crop left as a strided view into their own storage, so
    a compiled forward (whose guards pin the strides) sees one layout. Example: after
    `keep_rows` dropped 3 of 10 positions, keys [b, h, 7, d] with stride h * 10 * d -> h * 7 * d.
    """
    for layer in cache.layers:
        if layer.keys is not None and not layer.keys.is_contiguous():
            layer.keys = layer.keys.contiguous()
        if layer.values is not None and not layer.values.is_contiguous():
            layer.values = layer.values.contiguous()


class WindowLayer(DynamicLayer):
    """A sliding-window layer that can roll back: it holds positions [offset, offset + n), takes
    a forward's entries in full (so a rejected draft can be cropped off, which transformers'
    `DynamicSlidingWindowLayer` refuses once the window is full), and `trim` drops what no later
    query can see. Example: window 4, positions 0..9 held -> trim -> offset 7, n 3 (7, 8, 9).
    """

    is_sliding = True

    def __init__(self, window: int) -> None:
        super().__init__()
        self.window = window
        self.offset = 0  # positions dropped from the front

    def held(self) -> int:
        return super().get_seq_length()

    def get_seq_length(self) -> int:
        return self.offset + self.held()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.held() + query_length, self.offset  # the keys `update` returns, from offset

    def get_max_length(self) -> int:
        return self.window

    def trim(self) -> None:
        """Keep the last window - 1 positions: a query at p >= the length sees p - window + 1 on."""
        drop = self.held() - (self.window - 1)
        if drop > 0:
            self.keys = self.keys[:, :, drop:]
            self.values = self.values[:, :, drop:]
            self.offset += drop

    def reset(self) -> None:
        super().reset()
        self.offset = 0


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose `update` writes into spare capacity instead of concatenating, so a
    step over a long batch cache does not copy all of it. `keys` / `values` are views of the
    used part; assigning them (as `append_row` / `gather_rows` do) replaces the buffers.

    With `write_at` set (`set_write_columns`), batch row b writes its q new entries at columns
    [write_at[b], write_at[b] + q) and the used part becomes max(write_at) + q: rows of different
    lengths each append right after their own entries (a ragged batch in one tensor)."""

    def __init__(self) -> None:
        self._k = self._v = None  # [b, h, capacity, d]
        self._used = 0
        self.write_at: list[int] | None = None  # per batch row; None: everyone at `_used`
        super().__init__()

    @property
    def keys(self):
        return None if self._k is None else self._k[:, :, : self._used]

    @keys.setter
    def keys(self, value) -> None:
        self._k = value
        self._used = 0 if value is None or value.dim() < 4 else value.shape[2]

    @property
    def values(self):
        return None if self._v is None else self._v[:, :, : self._used]

    @values.setter
    def values(self, value) -> None:
        self._v = value

    def lazy_initialization(self, key_states, value_states) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[2]
        starts = self.write_at or [self._used] * key_states.shape[0]
        end = max(starts) + q
        if self._k is None or self._k.dim() < 4:
            self._k, self._v, self._used = key_states.new_zeros(0), value_states.new_zeros(0), 0
            self._grow(key_states, value_states, end)
        elif end > self._k.shape[2]:
            self._grow(key_states, value_states, end)
        if min(starts) == max(starts):  # one slice for every row
            self._k[:, :, starts[0] : end] = key_states
            self._v[:, :, starts[0] : end] = value_states
        else:
            columns = torch.tensor(starts, device=key_states.device)[:, None] + torch.arange(
                q, device=key_states.device
            )  # [b, q]
            self._k.scatter_(2, _per_entry(columns, key_states), key_states)
            self._v.scatter_(2, _per_entry(columns, value_states), value_states)
        self._used = end
        return self.keys, self.values

    def _grow(self, key_states, value_states, end: int) -> None:
        """Reallocate with room for half as much again (and 64 more) and copy the used part."""
        b, h, _, d = key_states.shape
        capacity = end * 3 // 2 + 64
        k = key_states.new_empty(b, h, capacity, d)  # never read past `_used`
        v = value_states.new_empty(b, h, capacity, value_states.shape[3])
        if self._used:
            k[:, :, : self._used] = self._k[:, :, : self._used]
            v[:, :, : self._used] = self._v[:, :, : self._used]
        self._k, self._v = k, v


def _per_entry(columns: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """[b, q] columns -> the scatter index for states [b, h, q, d]."""
    b, h, q, d = states.shape
    return columns[:, None, :, None].expand(b, h, q, d)


def set_write_columns(
    cache: DynamicCache, columns: list[int] | None, layers: Sequence[int] | None = None
) -> None:
    """The next forward writes batch row b's entries from column columns[b] on (None: all rows
    after the used part), in `layers` (indices; None: all). Only where `row_writes(cache)`."""
    for i in _indices(cache, layers):
        cache.layers[i].write_at = columns


def _indices(cache: DynamicCache, layers: Sequence[int] | None) -> Sequence[int]:
    return range(len(cache.layers)) if layers is None else layers


def row_writes(cache: DynamicCache) -> bool:
    """Every layer can write each batch row at its own column."""
    return all(isinstance(layer, GrowingLayer) for layer in cache.layers)


def new_batch_cache(config) -> DynamicCache:
    """A cache for a decode batch: every layer appends in place (`GrowingLayer`); sliding-window
    layers hold all of each row's positions too, and the engine's masks apply the window."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() for _ in layer_windows(config)]
    return cache


@torch.inference_mode()
def append_row(
    cache: DynamicCache,
    row_cache: DynamicCache,
    length: int,
    layers: Sequence[int] | None = None,
    first: int = 0,
) -> None:
    """Add `row_cache`'s positions [first, length) as a new batch row of `cache` (batch 1 there)
    in `layers` (indices; None: all), at columns 0, 1, ...

    Rows are right-padded with zeros to the longer of the two; the caller masks padding out.
    Example: cache [2 rows, 5 positions] + a row of 7 -> [3 rows, 7 positions].
    """
    for i in _indices(cache, layers):
        layer = cache.layers[i]
        keys, values = _row_entries(row_cache.layers[i], first, length)
        if not layer.is_initialized or layer.keys.numel() == 0:
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys.clone(), values.clone()
            continue
        width = max(layer.keys.shape[2], keys.shape[2])
        new_keys = torch.cat([_pad_to(layer.keys, width), _pad_to(keys, width)], dim=0)
        new_values = torch.cat([_pad_to(layer.values, width), _pad_to(values, width)], dim=0)
        layer.keys, layer.values = new_keys, new_values


@torch.inference_mode()
def write_row(
    cache: DynamicCache,
    row: int,
    row_cache: DynamicCache,
    length: int,
    layers: Sequence[int] | None = None,
    first: int = 0,
) -> None:
    """Overwrite batch row `row`'s first columns with `row_cache`'s positions [first, length)
    (batch 1 there) in `layers`, in place; the caller hides the row's other columns. Requires
    length - first <= the cache's columns."""
    for i in _indices(cache, layers):
        layer = cache.layers[i]
        keys, values = _row_entries(row_cache.layers[i], first, length)
        layer.keys[row, :, : length - first] = keys[0]
        layer.values[row, :, : length - first] = values[0]


def _row_entries(layer, first: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A request cache layer's positions [first, length) as [1, h, length - first, d] keys and
    values (a `WindowLayer` holds positions from its offset on; asking for older ones raises)."""
    offset = layer.offset if isinstance(layer, WindowLayer) else 0
    if first < offset:
        raise ValueError(f"positions from {first} asked of a window layer holding {offset} on")
    cols = slice(first - offset, length - offset)
    return layer.keys[:, :, cols], layer.values[:, :, cols]


def _pad_to(t: torch.Tensor, width: int) -> torch.Tensor:
    """[b, h, n, d] -> [b, h, width, d], zeros on the right."""
    extra = width - t.shape[2]
    return t if extra == 0 else torch.nn.functional.pad(t, (0, 0, 0, extra))


@torch.inference_mode()
def gather_rows(
    cache: DynamicCache,
    rows: torch.Tensor,
    columns: torch.Tensor,
    layers: Sequence[int] | None = None,
) -> None:
    """Keep batch rows `rows` [b'] and, for kept row i, columns `columns[i]` [b', n'] in order,
    in `layers` (indices; None: all).

    Example: rows [2, 0], columns [[0, 3], [1, 1]] leaves 2 rows of 2 positions: old row 2's
    positions 0 and 3, then old row 0's position 1 twice (repeats are how callers pad).
    """
    for i in _indices(cache, layers):
        layer = cache.layers[i]
        if not layer.is_initialized or layer.keys.numel() == 0:
            continue
        device = layer.keys.device
        r, c = rows.to(device), columns.to(device)
        _, heads, _, dim = layer.keys.shape
        index = c[:, None, :, None].expand(len(r), heads, c.shape[1], dim)
        new_keys = torch.gather(layer.keys[r], 2, index)
        new_values = torch.gather(layer.values[r], 2, index)
        layer.keys, layer.values = new_keys, new_values  # both read before either is replaced


ROW_ATTENTION = "specserve_rows"


class UnsupportedAttention(ValueError):
    """A layer asked the row attention for a feature it does not implement."""


# what the row attention receives and honours: the sdpa arguments; `sliding_window` (every mask
# it gets has the window applied: the engine's own, or transformers' where the model built it;
# none only where the window cannot bind); the layer's bookkeeping it has no use for.
_ATTENTION_KWARGS = frozenset(
    {
        "dropout",
        "scaling",
        "is_causal",
        "sliding_window",
        "position_ids",
        "use_cache",
        "output_hidden_states",
    }
)


def _check_attention_kwargs(module, kwargs: dict) -> None:
    """Raise for any keyword the row attention would otherwise drop (soft-capping, sinks...)."""
    unknown = sorted(k for k, v in kwargs.items() if k not in _ATTENTION_KWARGS and v is not None)
    if unknown:
        raise UnsupportedAttention(
            f"{type(module).__name__} passes {', '.join(unknown)} to the attention function; "
            f"the engine's row attention does not implement it (it handles "
            f"{', '.join(sorted(_ATTENTION_KWARGS))})"
        )


def _row_attention(module, query, key, value, attention_mask, row_extents=None, **kwargs):
    """transformers' sdpa without a mask. With one (query [b, heads, q, d], key/value
    [b, kv_heads, columns, d], mask [b, 1, q, columns]) and given `row_extents`, each batch row
    attends its own key columns [0, e_b) only, so short rows skip the long rows' padding; on CPU
    through torch's sdpa with grouped-query heads (transformers would copy every key/value head
    group there), elsewhere through transformers' sdpa. Returns ([b, q, heads, d], None).
    `row_extents` may be {layer type: extents} when the layer groups have their own columns.
    Keywords outside `_ATTENTION_KWARGS` raise `UnsupportedAttention`, never pass silently."""
    _check_attention_kwargs(module, kwargs)
    if isinstance(row_extents, dict):  # one list per layer type (`BatchKV.extents`)
        row_extents = row_extents[layer_type(module)]
    if attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)
    attend = _grouped_sdpa if query.device.type == "cpu" else _transformers_sdpa
    if row_extents is None:
        return attend(module, query, key, value, attention_mask, **kwargs), None
    outs = [
        attend(
            module,
            query[b : b + 1],
            key[b : b + 1, :, :e],
            value[b : b + 1, :, :e],
            attention_mask[b : b + 1, :, :, :e],
            **kwargs,
        )
        for b, e in enumerate(row_extents)
    ]
    return torch.cat(outs), None


def layer_type(attention) -> str:
    """ "sliding_attention" or "full_attention": the kind of the layer an attention module is
    in (from its config and `layer_idx`, as every transformers attention module has them)."""
    windowed = layer_windows(attention.config)[attention.layer_idx] is not None
    return "sliding_attention" if windowed else "full_attention"


def _grouped_sdpa(module, query, key, value, mask, scaling=None, dropout=0.0, **_) -> torch.Tensor:
    """torch's sdpa with grouped-query heads, [b, q, heads, d] (the caller checked the other
    keywords, see `_check_attention_kwargs`; a mask is always given here, so `is_causal` is moot)."""
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous()


def _transformers_sdpa(module, query, key, value, mask, **kwargs) -> torch.Tensor:
    """transformers' sdpa (its kernel choice for CUDA and others), [b, q, heads, d]."""
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)[0]


def enable_row_attention(model) -> bool:
    """Switch an sdpa model to `ROW_ATTENTION` (sdpa unless a forward passes `row_extents`);
    False (and nothing changed) for other attention implementations."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if base.config._attn_implementation == ROW_ATTENTION:
        return True
    if base.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(ROW_ATTENTION, _row_attention)
    AttentionMaskInterface.register(ROW_ATTENTION, sdpa_mask)
    base.set_attn_implementation(ROW_ATTENTION)
    return base.config._attn_implementation == ROW_ATTENTION


def strip_quantizer(model) -> None:
    """Turn a dequantized GGUF-loaded model into a plain one (savable, castable).

    transformers refuses save_pretrained while `hf_quantizer` is set, and a saved
    `quantization_config` (quant_method gguf) would make the reload go through the GGUF quantizer.
    """
    for attr in ("hf_quantizer", "quantization_method", "_weight_conversions"):
        if attr in model.__dict__:
            delattr(model, attr)
        elif hasattr(model, attr):
            with contextlib.suppress(AttributeError):
                setattr(model, attr, None)
    if hasattr(model, "is_quantized"):
        with contextlib.suppress(AttributeError):
            model.is_quantized = False
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        with contextlib.suppress(AttributeError):
            delattr(cfg, "quantization_config")
    if getattr(cfg, "_is_quantized", False):
        cfg._is_quantized = False


# --- hidden features and the base model's parts a drafter reuses (pinned by the same test) ---


def num_layers(model) -> int:
    """Decoder layers of the target."""
    return int(model.config.num_hidden_layers)


def hidden_features(out, layers: tuple[int, ...]) -> torch.Tensor:
    """[batch, q, len(layers), hidden] from a forward run with `output_hidden_states=True`.

    Layer index i in 0..L-2 is the output of decoder layer i (the pre-norm residual stream);
    -1 is the final normed hidden state, the LM head's input. transformers gives L + 1 states
    (embeddings first) and replaces the last layer's output by the normed one, so i maps to
    state i + 1 and the last layer's pre-norm output is not available.
    """
    states = out.hidden_states
    last = len(states) - 2  # index of the last decoder layer whose own output is kept
    for i in layers:
        if i != -1 and not 0 <= i < last:
            raise ValueError(f"feature layer {i}: valid are -1 and 0..{last - 1}")
    picked = [states[-1] if i == -1 else states[i + 1] for i in layers]
    return torch.stack(picked, dim=2)


def _decoder(model):
    """The decoder stack (`LlamaModel`, `GPTNeoXModel` and kin) of a causal LM, unwrapping a
    peft model: the attribute its class names as `base_model_prefix` (`model`, `gpt_neox`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix)


def decoder_layer(model, config=None, layer_idx: int = 0) -> torch.nn.Module:
    """A fresh decoder layer of the target's own class (randomly initialized, eval mode)."""
    layer_type = type(_decoder(model).layers[0])
    return layer_type(config or model.config, layer_idx=layer_idx)


def final_norm(model) -> torch.nn.Module:
    """The norm the target applies before its LM head (`norm`; GPT-NeoX: `final_layer_norm`)."""
    decoder = _decoder(model)
    return decoder.norm if hasattr(decoder, "norm") else decoder.final_layer_norm


def rotary(model, hidden: torch.Tensor, position_ids: torch.Tensor):
    """(cos, sin) position embeddings of the target for `position_ids` [batch, q], as its layer 0
    gets them (Gemma 3 keeps one rotary table per layer type)."""
    emb = _decoder(model).rotary_emb
    if "layer_type" in inspect.signature(emb.forward).parameters:
        return emb(hidden, position_ids, model.config.layer_types[0])
    return emb(hidden, position_ids=position_ids)


def layer_forward(layer, hidden, mask, position_ids, cache, position_embeddings) -> torch.Tensor:
    """One decoder layer over hidden [batch, q, H] with a 4D additive mask and an optional cache
    (its entries go to cache layer 0). Returns the layer's output hidden [batch, q, H]."""
    out = layer(
        hidden,
        attention_mask=mask,
        position_ids=position_ids,
        **({_layer_cache_keyword(type(layer)): cache} if cache is not None else {}),
        use_cache=cache is not None,
        position_embeddings=position_embeddings,
    )
    return out[0] if isinstance(out, tuple) else out


@functools.cache
def _layer_cache_keyword(layer_type: type) -> str:
    """`cache` in newer transformers, `past_key_values` before; GPT-NeoX layers take `layer_past`
    (a name the layer does not list would be swallowed by its **kwargs and the cache unused)."""
    params = inspect.signature(layer_type.forward).parameters
    names = [name for name in ("cache", "past_key_values", "layer_past") if name in params]
    if not names:
        raise ValueError(f"{layer_type.__name__}.forward takes no cache argument")
    return names[0]


def empty_cache() -> DynamicCache:
    """A cache with no preset layers (grows as layers write to it); for a drafter's own layer."""
    return DynamicCache()
