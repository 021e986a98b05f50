"""Sliding-window layers: which layers have a window (from the config's layer types), the cache
layer that can roll one back (`WindowLayer`), and the per-layer-type masks the model takes.
"""

from __future__ import annotations

import weakref

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, get_layer_types_and_kwargs


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


def layer_windows(config) -> tuple[int | None, ...]:
    """Per decoder layer: its sliding window (a query at position p sees keys at positions
    > p - window), or None for full attention. Example: Gemma 2 with window 4096 ->
    (4096, None, 4096, None, ...). Raises for layer kinds the engine does not serve (chunked,
    linear / recurrent, shared KV). Remembered per config object while it lives (transformers'
    per-layer configs cost ~0.5 ms to build; every multi-row forward asks)."""
    known = _WINDOWS.get(id(config))
    if known is not None and known[0]() is config:
        return known[1]
    windows = _layer_windows(config)
    _WINDOWS[id(config)] = (weakref.ref(config), windows)
    weakref.finalize(config, _WINDOWS.pop, id(config), None)
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
