"""A compiled target forward (`torch.compile`, inductor, dynamic shapes) for single-request verify
calls up to `max_width` query rows; prefill and the batched ragged forward stay eager. `warm`
compiles it over a scratch cache and measures it; calls run eager until then.
"""

from __future__ import annotations

import time
import weakref
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import DynamicCache

from specserve.engine import hf_internals
from specserve.engine.forward.head import column_head
from specserve.engine.forward.inputs import attention_masks, build_inputs
from specserve.engine.lora.batch import takes_adapters
from specserve.engine.tree import Draft, DraftTree

CONTEXT = 200  # cache length the warm-up measures at (as the cost curve does)
_ATTACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> CompiledForward


class CompileSettings(BaseModel):
    """How the target forward is compiled (whether: `tuning.compile_choice.decide`); unknown keys fail."""

    model_config = ConfigDict(extra="forbid")

    max_width: int = Field(64, ge=2, description="calls with more query rows run eager (prefill)")
    features: bool = Field(False, description="also warm the shapes that return hidden features")
    inductor_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = Field(
        "default",
        description="torch.compile's mode; reduce-overhead replays CUDA graphs (the GPU fast path)",
    )


class CompileRecord(BaseModel):
    """What one warm-up measured: eager vs compiled verify forwards at CONTEXT, and its start."""

    model_id: str
    device: str
    dtype: str
    threads: int
    torch: str
    eager_ms: dict[int, float]  # k query rows -> median ms
    compiled_ms: dict[int, float]
    start_s: float  # warm-up: tracing + compiling (or loading from disk) every shape
    max_abs_diff: float  # largest |compiled - eager| logit over the measured forwards
    graphs: int = 0  # graphs dynamo captured in the warm-up
    cache_hits: dict[str, int] = {}  # on-disk caches that served (or missed) this start

    @property
    def gain(self) -> float:
        """eager / compiled cost of the 1-token forward. Example: 53.4 vs 35.8 ms -> 1.49."""
        return self.eager_ms[1] / self.compiled_ms[1]

    @property
    def bit_exact(self) -> bool:
        return self.max_abs_diff == 0.0


class CompileUnsupported(ValueError):
    """The model cannot be compiled safely here (the reason names what)."""


def measured_on(model) -> dict:
    """Where a measurement of `model` was taken: the record fields a cached record is keyed by."""
    return {
        "device": str(model.device),
        "dtype": str(model.dtype),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def medians_ms(times: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
    """Median milliseconds per label and size. Example: {"eager": {1: [0.003, 0.001, 0.002]}}
    -> {"eager": {1: 2.0}}."""
    return {
        label: {k: round(sorted(t)[len(t) // 2] * 1000, 2) for k, t in per.items()}
        for label, per in times.items()
    }


def sync_device(device: torch.device) -> None:
    """Wait for queued kernels, so a wall-clock time covers them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attach(model, settings: CompileSettings) -> CompiledForward:
    """Give `model` a compiled forward (not yet warm); `verify_forward` routes through `runner`."""
    compiled = CompiledForward(model, settings)
    _ATTACHED[model] = compiled
    return compiled


def runner(model, q: int, past: int):
    """The callable for a verify forward of q query rows after `past` cached positions: the model,
    or its warm compiled forward."""
    compiled = _ATTACHED.get(model)
    return model if compiled is None else compiled.runner(q, past)


def forward_key(model) -> str:
    """The dtype, plus "+invariant" on the position-invariant forward, "+compiled" once the
    compiled forward serves and "+column_head" with the column LM head (`head`): keys the cost
    curve and tuning, which differ between them. Example: "torch.bfloat16+invariant"."""
    if hf_internals.is_invariant(model):  # it never runs compiled (`verify_forward`)
        return f"{model.dtype}+invariant"
    compiled = _ATTACHED.get(model)
    suffix = "+compiled" if compiled is not None and compiled.ready else ""
    suffix += "+column_head" if column_head(model) else ""
    return f"{model.dtype}{suffix}"


class CompiledForward:
    """The compiled forward of one plain (adapter-free) HF model and which call shapes are warm.

    A shape is (single query row, hidden features requested): the 1-row call passes no mask, so it
    is its own graph; wider calls share one dynamic graph. Until `ready`, `runner` returns the
    model itself; afterwards an unseen shape runs eager instead of recompiling in the caller.
    """

    def __init__(self, model, settings: CompileSettings) -> None:
        if takes_adapters(model):
            raise CompileUnsupported(
                "compile: a model with LoRA adapters stays eager (an adapter load would retrace "
                "the forward); serve the base model compiled or set compile off"
            )
        self.model = model
        self.settings = settings
        self._compiled = torch.compile(
            model.forward, dynamic=True, mode=settings.inductor_mode, fullgraph=False
        )
        self.record: CompileRecord | None = None  # set by `warm`; until then calls run eager

    @property
    def ready(self) -> bool:
        return self.record is not None

    def runner(self, q: int, past: int):
        """What to call for a forward of q query rows: the compiled forward, or the model for
        prefill (an empty cache or more than `max_width` rows) and until warm."""
        if past == 0 or q > self.settings.max_width or not self.ready:
            return self.model
        return self

    def __call__(self, **kwargs):
        """The compiled forward over a cache in its one guarded layout (contiguous entries)."""
        for value in kwargs.values():
            if isinstance(value, DynamicCache):
                hf_internals.make_contiguous(value)
        return self._compiled(**kwargs)

    def warm(self, model_id: str, widths: tuple[int, ...] = (1, 2, 4, 8)) -> CompileRecord:
        """Compile every shape (1 row; 5 rows keeping 3 logits, so no size coincidences get
        specialized), then time eager vs compiled at `widths` over a CONTEXT-token cache."""
        before = _cache_counters()
        start = time.perf_counter()
        cache, prefix = _scratch_cache(self.model)
        hidden = (False, True) if self.settings.features else (False,)
        # floats (norm eps, attention scale) as constants: tracing them as tensors made dynamo
        # restart its analysis, tracing each graph twice (measured); the graphs hold after
        with (
            torch._dynamo.config.patch(specialize_float=True, recompile_limit=32),
            torch.compiler.set_stance("default"),
        ):
            for features in hidden:
                for q, keep in ((1, 1), (5, 3)):
                    _call(self, self.model, cache, prefix[:q], keep, features)
        start_s = time.perf_counter() - start
        eager, compiled, diff = _compare(self.model, self, cache, prefix, widths)
        self.record = CompileRecord(
            model_id=model_id,
            **measured_on(self.model),
            eager_ms=eager,
            compiled_ms=compiled,
            start_s=round(start_s, 1),
            max_abs_diff=diff,
            graphs=_cache_counters()["graphs"] - before["graphs"],
            cache_hits={k: v - before[k] for k, v in _cache_counters().items() if k != "graphs"},
        )
        torch.compiler.set_stance("eager_on_recompile")  # no minutes-long compile in the loop
        return self.record


def _cache_counters() -> dict[str, int]:
    """Dynamo's process-wide counts of captured graphs and of on-disk cache hits and misses."""
    from torch._dynamo.utils import counters  # lazy: torch._dynamo adds ~3.5 s to import

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "fx_graph_hit": counters["inductor"]["fxgraph_cache_hit"],
        "fx_graph_miss": counters["inductor"]["fxgraph_cache_miss"],
        "aot_autograd_hit": counters["aot_autograd"]["autograd_cache_hit"],
        "aot_autograd_miss": counters["aot_autograd"]["autograd_cache_miss"],
    }


def _scratch_cache(model):
    vocab = model.config.vocab_size
    prefix = [(7 * i + 3) % vocab for i in range(CONTEXT)]
    cache = hf_internals.new_cache(model.config)
    _call(model, model, cache, prefix[: CONTEXT - 1], 1, False, past=0)
    return cache, prefix


@torch.inference_mode()
def _call(fn, model, cache, tokens, keep, features, past=CONTEXT - 1):
    """`fn` over `verify_forward`'s layout of `tokens` (pending token + a chain draft) after
    `past` cached positions, which are all that remain after; the logits of the last `keep`
    verified rows."""
    chain = DraftTree(tuple(tokens[1:]), tuple(range(-1, len(tokens) - 2)))
    inputs = build_inputs(past, tokens[:1] if past else tokens, Draft(chain) if past else Draft())
    device = model.device
    q = inputs.input_ids.shape[1]
    offset = hf_internals.window_offset(cache)
    mask = (
        None if q == 1 else attention_masks(model.config, inputs, past, offset, model.dtype, device)
    )
    out = fn(
        input_ids=inputs.input_ids.to(device),
        position_ids=inputs.position_ids.to(device),
        attention_mask=mask,
        **hf_internals.cache_kwargs(model, cache),
        use_cache=True,
        logits_to_keep=inputs.logit_rows[-keep:].to(device),
        **({"output_hidden_states": True} if features else {}),
    )
    if past > 0:
        hf_internals.keep_rows(cache, past, [])
    return out.logits[0]  # [keep, vocab]


def _compare(model, compiled, cache, prefix, widths, repeats: int = 5):
    """Median ms per width, eager and compiled (interleaved), and the largest logit difference."""
    times: dict[str, dict[int, list[float]]] = {"eager": {}, "compiled": {}}
    diff = 0.0
    for _ in range(repeats):
        for k in widths:
            outs = []
            for label, fn in (("eager", model), ("compiled", compiled)):
                sync_device(model.device)
                start = time.perf_counter()
                outs.append(_call(fn, model, cache, prefix[:k], k, False).float())
                sync_device(model.device)
                times[label].setdefault(k, []).append(time.perf_counter() - start)
            diff = max(diff, (outs[0] - outs[1]).abs().max().item())
    median = medians_ms(times)
    return median["eager"], median["compiled"], diff
