"""A compiled batched forward (a server's decode step): `torch.compile` of the target over a batch
cache written through tensor indices (`hf_internals.set_write_index`), a mask over its whole
reserved width and slotted LoRA, so four graphs (1 or more rows x 1 or more query rows) hold for
any batch layout, cache length and adapter mix. `warm` compiles them over a scratch batch and
measures eager vs compiled steps; until then, and for calls it cannot take, the step runs eager.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from specserve.engine import hf_internals
from specserve.engine.forward.batch_cache import BatchKV
from specserve.engine.forward.batch_rows import BatchRow, run_rows
from specserve.engine.forward.compiled import (
    CompileUnsupported,
    measured_on,
    medians_ms,
    sync_device,
)
from specserve.engine.forward.inputs import additive_mask
from specserve.engine.lora.batch import BASE_ADAPTER, is_peft_model, takes_adapters
from specserve.engine.lora.store import store_dtype, store_of
from specserve.engine.tree import Draft, DraftTree

log = logging.getLogger("specserve.compile")
CONTEXT = 200  # cache length the warm-up measures at (as the cost curve does)
RECOMPILE_LIMIT = 32  # graphs per code object: verify (up to 4) + batched (4), per model class
_ATTACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> CompiledBatch


class BatchCompileSettings(BaseModel):
    """How the batched forward is compiled (whether: `tuning.compile_choice.decide`); unknown keys fail."""

    model_config = ConfigDict(extra="forbid")

    lora_modules: tuple[str, ...] = Field(
        ("q_proj", "k_proj", "v_proj", "o_proj"),
        description="Linear names (last part) hooked for LoRA before compiling, on a model with a "
        "LoRA store; an adapter touching others makes its batches run eager",
    )
    lora_rank: int = Field(8, ge=1, description="adapters up to this rank share the compiled slots")
    rows: tuple[int, ...] = Field((1, 16), description="batch rows the warm-up measures at")
    inductor_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = "default"


class BatchCompileRecord(BaseModel):
    """What one warm-up measured: eager vs compiled batched steps at CONTEXT, and its start."""

    model_id: str
    device: str
    dtype: str
    threads: int
    torch: str
    eager_ms: dict[int, float]  # batch rows (one query row each) -> median ms per step
    compiled_ms: dict[int, float]
    start_s: float  # warm-up: tracing + compiling (or loading from disk) the four graphs
    max_abs_diff: float  # largest |compiled - eager| logit over the measured steps
    graphs: int = 0

    @property
    def gain(self) -> float:
        """eager / compiled cost of the widest measured step. Example: 152 vs 120 ms -> 1.27."""
        rows = max(self.compiled_ms)
        return self.eager_ms[rows] / self.compiled_ms[rows]

    @property
    def bit_exact(self) -> bool:
        return self.max_abs_diff == 0.0


def attach_batch(model, settings: BatchCompileSettings) -> CompiledBatch:
    """Give `model` a compiled batched forward (not yet warm); `verify_batch_forward` routes
    through `runner`."""
    compiled = CompiledBatch(model, settings)
    _ATTACHED[model] = compiled
    return compiled


def runner(model, kv, feature_layers: bool) -> CompiledBatch | None:
    """The warm compiled batched forward for this call, or None (eager): not attached or not warm
    yet, the position-invariant forward (its attention runs eager), a cache with sliding-window
    groups, or hidden features asked (they graph-break)."""
    compiled = _ATTACHED.get(model)
    if compiled is None or not compiled.serves or feature_layers or len(kv.groups) != 1:
        return None
    if hf_internals.is_invariant(model):
        return None
    return compiled if compiled.enabled else None


class CompiledBatch:
    """The compiled forward of one model over batch caches. On a model with a LoRA store, the
    `lora_modules` are hooked up front (`RowLoRA.pin`) so adapter loads never change the graph."""

    def __init__(self, model, settings: BatchCompileSettings) -> None:
        if is_peft_model(model):
            raise CompileUnsupported("compile: a peft-wrapped model stays eager (serve a store)")
        if any(w is not None for w in hf_internals.layer_windows(model.config)):
            raise CompileUnsupported(
                "compile: the batched forward of a sliding-window model stays eager (its layer "
                "groups keep their own columns)"
            )
        self.model = model
        self.settings = settings
        hf_internals.enable_row_attention(
            model
        )  # what the scheduler switches to: the graphs guard it
        store = store_of(model)
        if store is not None:
            modules = [
                m
                for name, m in model.named_modules()
                if isinstance(m, torch.nn.Linear)
                and name.rsplit(".", 1)[-1] in settings.lora_modules
            ]
            if not modules:
                raise CompileUnsupported(f"compile: no Linear named {settings.lora_modules}")
            store.pin(modules, settings.lora_rank, store_dtype(model.dtype))
        self._compiled = torch.compile(model.forward, dynamic=True, mode=settings.inductor_mode)
        self.record: BatchCompileRecord | None = None  # set by `warm`; until then calls run eager
        self._warming: int | None = None  # the thread warming up (its calls route here)
        self.calls = 0  # steps routed here (after warm-up), for tests and figures
        self.enabled = True  # False: every step eager (a paired eager-vs-compiled measurement)

    @property
    def ready(self) -> bool:
        return self.record is not None

    @property
    def serves(self) -> bool:
        """Calls route here: warm, or warming up on this thread (the engine loop may serve
        eager beside a warm-up in another thread)."""
        return self.ready or self._warming == threading.get_ident()

    def __call__(self, kv, inputs, starts: list[int], q: int, **kwargs):
        """The model's output for `inputs` (a `BatchInputs` laid out after `kv.begin(q)`): entries
        written at [starts[b], starts[b] + q) of the reserved buffers, every row attending the
        used width (no per-row extents: those are Python lists)."""
        self.calls += 0 if self._warming else 1  # warm-up steps are not counted
        end = max(starts) + q  # == kv.columns after `begin`
        hf_internals.reserve(kv.cache, end)
        index = torch.tensor(starts)[:, None] + torch.arange(q)  # [b, q]
        device = self.model.device
        mask = additive_mask(inputs.allowed, self.model.dtype, device)[:, None]  # [b, 1, q, end]
        hf_internals.set_write_index(kv.cache, index.to(device), end)
        _static_dims(kv.cache)
        try:
            with _tracing_config():
                return self._compiled(
                    input_ids=inputs.input_ids.to(device),
                    position_ids=inputs.position_ids.to(device),
                    attention_mask=hf_internals.layer_masks(self.model.config, mask, None),
                    **hf_internals.cache_kwargs(self.model, kv.cache),
                    use_cache=True,
                    **kwargs,
                )
        finally:
            hf_internals.set_write_index(kv.cache, None)

    def warm(self, model_id: str) -> BatchCompileRecord:
        """Compile the four graphs (1 or 3 rows x 1 or 5 query rows, the wide ones keeping 2
        logit rows: sizes that coincide would be unified in the graph), then time eager vs
        compiled steps at `settings.rows` rows over CONTEXT-token rows, interleaved."""
        from torch._dynamo.utils import counters  # lazy: torch._dynamo adds ~3.5 s to import

        graphs = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        self._warming = threading.get_ident()
        try:
            with torch.compiler.set_stance("default"):
                for rows in (1, 3):
                    kv = scratch_batch(self.model, rows)
                    for q in (1, 5):
                        began = time.perf_counter()
                        _step(self.model, kv, rows, q, compiled=True)
                        log.info(
                            "compiled batched forward: graph %d x %d in %.0f s",
                            rows,
                            q,
                            time.perf_counter() - began,
                        )
            start_s = time.perf_counter() - start
            eager, compiled, diff = self._compare()
        finally:
            self._warming = None
        self.record = BatchCompileRecord(
            model_id=model_id,
            **measured_on(self.model),
            eager_ms=eager,
            compiled_ms=compiled,
            start_s=round(start_s, 1),
            max_abs_diff=diff,
            graphs=counters["stats"]["unique_graphs"] - graphs,
        )
        torch.compiler.set_stance("eager_on_recompile")  # no minutes-long compile in the loop
        return self.record

    def _compare(self, repeats: int = 5):
        times: dict[str, dict[int, list[float]]] = {"eager": {}, "compiled": {}}
        diff = 0.0
        kvs = {rows: scratch_batch(self.model, rows) for rows in self.settings.rows}
        for _ in range(repeats):
            for rows, kv in kvs.items():
                outs = []
                for label in ("eager", "compiled"):
                    sync_device(self.model.device)
                    begin = time.perf_counter()
                    outs.append(_step(self.model, kv, rows, 1, compiled=label == "compiled"))
                    sync_device(self.model.device)
                    times[label].setdefault(rows, []).append(time.perf_counter() - begin)
                diff = max(diff, (outs[0] - outs[1]).abs().max().item())
        median = medians_ms(times)
        return median["eager"], median["compiled"], diff


def _tracing_config():
    """Dynamo settings a batched graph needs: tensors reached through modules (the LoRA slot
    buffers, the selector) keep dynamic sizes, and floats (norm eps, attention scale) are
    constants (see `CompiledForward.warm`). One code object (the model class's `forward`) holds
    the verify graphs and these four, more than dynamo's default limit of 8 lets a process
    keep. Equal sizes stay unified (duck shapes): without it
    every slot buffer's size is its own symbol and inductor spent over 12 minutes fusing
    SmolLM2's graph (measured); the warm-up's sizes avoid coincidences instead, and the sizes
    that never change are marked static (`_static_dims`)."""
    return torch._dynamo.config.patch(
        force_nn_module_property_static_shapes=False,
        specialize_float=True,
        recompile_limit=RECOMPILE_LIMIT,
    )


def _static_dims(cache) -> None:
    """Heads and head size of every cache buffer are fixed: marked static, so a batch or width
    that happens to equal them is never unified with them."""
    for layer in cache.layers:
        for t in (layer._k, layer._v):
            torch._dynamo.mark_static(t, 1)
            torch._dynamo.mark_static(t, 3)


def scratch_batch(model, rows: int):
    """A `BatchKV` of `rows` rows, each holding the same CONTEXT - 1 scratch positions."""
    vocab = model.config.vocab_size
    prefix = [(7 * i + 3) % vocab for i in range(CONTEXT - 1)]
    cache = hf_internals.new_cache(model.config)
    with torch.inference_mode():
        model(
            input_ids=torch.tensor([prefix], device=model.device),
            **hf_internals.cache_kwargs(model, cache),
            use_cache=True,
            logits_to_keep=1,
        )
    kv = BatchKV(model.config)
    for _ in range(rows):
        kv.add(cache, CONTEXT - 1)
    return kv


def _step(model, kv, rows: int, q: int, compiled: bool) -> torch.Tensor:
    """One batched step of `rows` rows, each a pending token (q = 1) or a pending token and one
    draft token padded to q query rows (adapters: none selected), whose new entries are then
    dropped; row 0's logits [1 or 2, vocab]."""
    draft = Draft(DraftTree((5,), (-1,))) if q > 1 else Draft()
    adapter = BASE_ADAPTER if takes_adapters(model) else None
    past = kv.lengths()
    batch = [BatchRow(past[b], [3 + b], draft, adapter) for b in range(rows)]
    fast = runner(model, kv, False) if compiled else None
    out = run_rows(model, kv, batch, q, fast)  # every row padded to q query rows
    for b in range(rows):
        kv.keep(b, [])
    return out[0].tree_logits.float()
