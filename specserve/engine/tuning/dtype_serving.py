"""The serving step `--dtype auto` times: the scheduler's real loop (batched rows, LoRA rows, chunked
prefill of arriving requests) over a Spec-Bench-shaped mix; decode tokens per second at `rows` rows
and at 1 row per dtype, their windows alternating, each bounded in time; nothing compiled (eager).
"""

from __future__ import annotations

import copy
import itertools
import time

import torch
from pydantic import BaseModel, Field

from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.decode.core import Decoder
from specserve.engine.decode.engine import Engine
from specserve.engine.decode.state import RequestState
from specserve.engine.forward.compiled import sync_device
from specserve.engine.lora.store import attach_store, store_dtype
from specserve.engine.sampling import SamplingParams

# Prompt tokens (SmolLM2 chat template) of Spec-Bench's dev mix, ../shared/bench/specbench_dev.jsonl
# (240 prompts, 6 tasks): the 16 mid-quantiles n[(i + 0.5) * 240 / 16], i = 0..15, sorted (mean
# 299; the file's mean 300, min 39, max 1598), measured 2026-12-03. A constant: the choice reads
# no data file.
SPECBENCH_PROMPT_TOKENS = (39, 42, 46, 55, 62, 70, 80, 92, 99, 114, 210, 486, 663, 734, 803, 1184)
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


class ServingMix(BaseModel):
    """What one dtype's serving step is timed on (defaults: a replica under load)."""

    rows: int = Field(16, ge=1, description="requests decoding together (the load)")
    prompt_tokens: tuple[int, ...] = Field(
        SPECBENCH_PROMPT_TOKENS, min_length=1, description="context lengths the rows are drawn at"
    )
    new_tokens: int = Field(
        128,
        ge=1,
        description="tokens a request generates: sets how often one finishes and a new "
        "one arrives to be prefilled (rows / new_tokens arrivals a step)",
    )
    prefill_chunk: int = Field(BatchSettings().prefill_chunk, ge=1)
    adapters: int = Field(4, ge=0, description="random LoRA adapters, on every other row")
    adapter_rank: int = Field(8, ge=1)
    steps: int = Field(16, ge=1, description="decode steps timed at `rows` rows")
    warmup_steps: int = Field(2, ge=0)
    alone_context: int = Field(300, ge=1, description="context of the 1-row figure")
    alone_steps: int = Field(8, ge=1)
    rounds: int = Field(2, ge=1, description="timed windows per dtype, the dtypes alternating")
    seconds: float = Field(6.0, gt=0, description="time bound of one timed window")


class ServingFigures(BaseModel):
    """One dtype's measured serving step."""

    rows: int
    tok_s: float  # decode tokens per second at `rows` rows, arrivals prefilled in the window
    alone_tok_s: float  # decode tokens per second of one request alone
    steps: int  # decode steps timed (fewer than asked when the time bound cut the window)
    prefill_tokens: int  # arriving prompt tokens prefilled within the window
    seconds: float
    windows: list[float] = []  # tok/s of every timed window at `rows` rows (their spread: noise)


def row_contexts(lengths: tuple[int, ...], rows: int) -> list[int]:
    """`rows` contexts spread evenly over `lengths` (sorted). Example: (10, 20, 30, 40), rows 2 ->
    [20, 40]; rows 6 -> [10, 20, 20, 30, 40, 40]."""
    ordered = sorted(lengths)
    return [ordered[int((i + 0.5) * len(ordered) / rows)] for i in range(rows)]


def arrival_order(lengths: tuple[int, ...]) -> list[int]:
    """`lengths` reordered so the mean of every prefix stays closest to the mean of all (a short
    window's few arrivals then prefill about the mix's share). Example: (10, 20, 30, 100) ->
    [30, 20, 100, 10]; its prefixes average 30, 25, 50, 40 against a mean of 40."""
    target, left, order = sum(lengths) / len(lengths), list(lengths), []
    while left:
        best = min(left, key=lambda n: (abs((sum(order) + n) / (len(order) + 1) - target), n))
        left.remove(best)
        order.append(best)
    return order


def fitted(mix: ServingMix, positions: int | None) -> ServingMix:
    """`mix` with contexts cut to what a model of `positions` positions holds with a request's
    new tokens (tiny test models). Example: 256 positions, 128 new tokens, 2 warm-up steps ->
    contexts at most 124."""
    if not positions:
        return mix
    most = max(positions - mix.new_tokens - mix.warmup_steps - 2, 2)
    update = {
        "prompt_tokens": tuple(min(n, most) for n in mix.prompt_tokens),
        "alone_context": min(mix.alone_context, most),
    }
    return mix.model_copy(update=update)


def measure_serving(
    model, dtypes: list[torch.dtype], mix: ServingMix | None = None
) -> dict[str, ServingFigures]:
    """{dtype name: figures}: `mix` timed on a copy of `model` in each dtype (the model itself
    is left as it was), the dtypes' windows alternating for `mix.rounds` rounds; each keeps its
    fastest window (a busy neighbour only ever slows one down)."""
    mix = fitted(mix or ServingMix(), getattr(model.config, "max_position_embeddings", None))
    benches = {str(d): _Bench(model, d, mix) for d in dtypes}
    alone = {d: [] for d in benches}
    loaded = {d: [] for d in benches}
    for _ in range(mix.rounds):
        for d, bench in benches.items():
            alone[d].append(bench.alone.window(mix.alone_steps, mix.seconds))
            loaded[d].append(bench.loaded.window(mix.steps, mix.seconds))
    out = {}
    for d in benches:
        best = max(loaded[d], key=lambda w: w.tok_s)
        fastest_alone = max(w.tok_s for w in alone[d])
        every = [w.tok_s for w in loaded[d]]
        out[d] = best.model_copy(update={"alone_tok_s": fastest_alone, "windows": every})
    return out


class _NoText:
    """Tokenizer stand-in: the ids are synthetic and their text is never read."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""


def _random_adapters(model, mix: ServingMix) -> list[str]:
    """`mix.adapters` random rank-r adapters on the attention projections, held in the model's
    LoRAStore (what a replica's resident adapters are); their values do not matter here."""
    if not mix.adapters:
        return []
    store, dt = attach_store(model), store_dtype(model.dtype)
    gen = torch.Generator().manual_seed(0)
    linears = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LORA_MODULES
    ]
    names = [f"dtype-auto-{i}" for i in range(mix.adapters)]
    for name in names:
        tensors = {
            module: (
                (torch.randn(mix.adapter_rank, m.in_features, generator=gen) * 0.02).to(dt),
                (torch.randn(m.out_features, mix.adapter_rank, generator=gen) * 0.02).to(dt),
            )
            for module, m in linears
        }
        store.add(name, tensors)
    return names


def _ids(length: int, seed: int, vocab: int) -> list[int]:
    return [(7919 * (seed * 4099 + i) + 11) % vocab for i in range(length)]


def _prefilled(engine: Decoder, context: int, new: int, seed: int, adapter) -> RequestState:
    """A request whose first `context - 1` prompt positions are already cached (synthetic keys and
    values: a decode step costs the same whatever they hold), its last token pending, as a shared
    prefill leaves it (batch/prefix_share.py); the scheduler's own prefill step takes it from there."""
    model = engine.model
    params = SamplingParams(max_new_tokens=new, ignore_eos=True, seed=seed)
    state = engine.start(
        _ids(context, seed, model.config.vocab_size), params, "ar", adapter=adapter
    )
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    gen = torch.Generator().manual_seed(seed)
    for layer in range(cfg.num_hidden_layers):
        k, v = (torch.randn(1, heads, context - 1, dim, generator=gen) for _ in range(2))
        state.cache.update(k.to(model.device, model.dtype), v.to(model.device, model.dtype), layer)
    state.pending = state.pending[-1:]
    return state


class _Loop:
    """A scheduler kept decoding between timed windows (its rows finish and are replaced)."""

    def __init__(self, scheduler: Scheduler, tokens: list[int], rows: int) -> None:
        self.scheduler, self.tokens, self.rows = scheduler, tokens, rows

    def drive(self, steps: int, deadline: float) -> int:
        """Step until `steps` decode steps ran or `deadline` passed; the decode steps run."""
        before = self.scheduler.stats().decode_steps
        ran = 0
        while ran < steps and time.perf_counter() < deadline:
            if not self.scheduler.step():
                break
            ran = self.scheduler.stats().decode_steps - before
        return ran

    def window(self, steps: int, seconds: float) -> ServingFigures:
        device = self.scheduler.engine.model.device
        sync_device(device)
        start, self.tokens[0] = time.perf_counter(), 0
        prefilled = self.scheduler.stats().prefill_tokens
        ran = self.drive(steps, start + seconds)
        sync_device(device)
        took = time.perf_counter() - start
        return ServingFigures(
            rows=self.rows,
            tok_s=round(self.tokens[0] / took, 2),
            alone_tok_s=0.0,
            steps=ran,
            prefill_tokens=self.scheduler.stats().prefill_tokens - prefilled,
            seconds=round(took, 3),
        )


def _count(tokens: list[int], then=None):
    def sink(step, finished: bool) -> None:
        if step is not None:
            tokens[0] += len(step.new_ids)
        if finished and then is not None:
            then()

    return sink


class _Bench:
    """One dtype's copy of the model with its two loops set up and warm: one request alone (the
    base model) and `mix.rows` rows under load."""

    def __init__(self, model, dtype: torch.dtype, mix: ServingMix) -> None:
        served = copy.deepcopy(model).to(dtype).eval()
        names = _random_adapters(served, mix)
        self.engine = Engine(served, _NoText(), frozenset())
        self.alone = self._alone(mix)
        self.loaded = self._loaded(mix, names)

    def _alone(self, mix: ServingMix) -> _Loop:
        engine, tokens = self.engine, [0]
        scheduler = Scheduler(engine, BatchSettings(max_batch=1, prefill_chunk=mix.prefill_chunk))
        new = 2 + mix.warmup_steps + mix.rounds * mix.alone_steps  # it outlasts every window
        state = _prefilled(engine, mix.alone_context, new, 1, None)
        scheduler.submit(state, "t", False, _count(tokens))
        loop = _Loop(scheduler, tokens, 1)
        loop.drive(mix.warmup_steps, float("inf"))  # its prefill step, then warm decode steps
        return loop

    def _loaded(self, mix: ServingMix, names: list[str]) -> _Loop:
        """Rows in steady state: row r has r * new_tokens / rows tokens left, so about rows /
        new_tokens finish a step; each finished request is replaced at once by a new one (the
        next of `arrival_order`), which the scheduler prefills in chunks between decode steps."""
        engine, tokens = self.engine, [0]
        settings = BatchSettings(max_batch=mix.rows, prefill_chunk=mix.prefill_chunk)
        scheduler = Scheduler(engine, settings)
        arrivals = itertools.cycle(arrival_order(mix.prompt_tokens))
        vocab, seeds = engine.model.config.vocab_size, itertools.count(1000)
        adapter = [None, *names]

        def arrive() -> None:
            seed = next(seeds)
            params = SamplingParams(max_new_tokens=mix.new_tokens, ignore_eos=True, seed=seed)
            name = adapter[seed % len(adapter)]
            state = engine.start(_ids(next(arrivals), seed, vocab), params, "ar", adapter=name)
            scheduler.submit(state, "t", False, _count(tokens, arrive))

        for r, context in enumerate(row_contexts(mix.prompt_tokens, mix.rows)):
            left = 1 + mix.warmup_steps + r * mix.new_tokens // mix.rows + 1
            name = names[(r // 2) % len(names)] if names and r % 2 else None
            state = _prefilled(engine, context, left, r, name)
            scheduler.submit(state, "t", False, _count(tokens, arrive))
        while len(scheduler.decoding) < mix.rows:  # each row's last prompt token
            scheduler.step()
        loop = _Loop(scheduler, tokens, mix.rows)
        loop.drive(mix.warmup_steps, float("inf"))
        return loop
