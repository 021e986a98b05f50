"""`--dtype auto`: the dtype in which a typical request (prefill + decode, alone or sharing its
decode steps with a batch) is cheapest on this device, measured once per (model, device, threads)
and cached beside the cost curves; never a CPU-flag guess (bf16 is natively fast on some CPUs,
slow on AVX2-only ones, pytorch#146508).
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from pathlib import Path

import torch
from pydantic import BaseModel, Field, ValidationError

from specserve.engine import hf_internals
from specserve.engine.cost import cache_stem, measure_cost_curve, sync_device
from specserve.engine.forward import verify_forward
from specserve.engine.tree import Draft

# fp32 is the exact mode: another dtype must beat it by this factor to be chosen (noise margin)
MIN_GAIN = 1.05
FORMAT = 3
MEASURED_ROWS = (1, 4, 16)  # query rows of the timed verify forwards


class Workload(BaseModel):
    """The request the choice prices (session 6 measured 292 prompt tokens on average over
    Spec-Bench's six-task mix with the chat template)."""

    prompt_tokens: int = 300
    new_tokens: int = 128
    rows: int = Field(
        1,
        ge=1,
        description="requests decoding together in one forward: 1 for a command, a replica's "
        "typical batch for the model server (a row's share of the step is what it pays)",
    )


class DtypeCost(BaseModel):
    ms: dict[int, float]  # {k: ms of a k-token verify forward over a 200-token context}
    prefill_ms_per_token: float  # one forward over 128 prompt tokens, per token
    request_ms: float  # `request_ms` of the choice's workload


class DtypeChoice(BaseModel):
    format: int = FORMAT
    model_id: str
    device: str
    threads: int
    torch_version: str
    context: int
    workload: Workload
    costs: dict[str, DtypeCost]  # dtype name -> measured costs
    chosen: str
    reason: str


def candidates(device: torch.device) -> list[torch.dtype]:
    """The dtypes auto tries: CPU float32 and bfloat16; CUDA bfloat16 only."""
    if torch.device(device).type == "cuda":
        return [torch.bfloat16]
    return [torch.float32, torch.bfloat16]


def step_ms(ms: dict[int, float], rows: int) -> float:
    """Cost of one forward of `rows` query rows: linear between measured sizes, scaled linearly
    past the largest. Example: ms {1: 50, 4: 100, 16: 300}, rows 10 -> 200.0; rows 32 -> 600.0."""
    sizes = sorted(ms)
    if rows in ms:
        return ms[rows]
    if rows > sizes[-1]:
        return ms[sizes[-1]] * rows / sizes[-1]
    hi = next(s for s in sizes if s > rows)
    lo = max(s for s in sizes if s < rows)
    return ms[lo] + (ms[hi] - ms[lo]) * (rows - lo) / (hi - lo)


def request_ms(ms: dict[int, float], prefill_ms_per_token: float, workload: Workload) -> float:
    """A request's prefill plus its share of `new_tokens` decode steps of `rows` rows.

    Example: ms {1: 60}, 2.4 ms a prompt token, 300 + 128 tokens alone -> 8400.0 ms; with
    ms {1: 60, 16: 160} and 16 rows a step, each pays 10 ms a token -> 720 + 1280 = 2000.0 ms.
    """
    decode = step_ms(ms, workload.rows) / workload.rows
    return workload.prompt_tokens * prefill_ms_per_token + workload.new_tokens * decode


def for_workload(choice: DtypeChoice, workload: Workload) -> DtypeChoice:
    """The same measured costs priced for another workload (nothing is measured again)."""
    if choice.workload == workload:
        return choice
    costs = {
        d: c.model_copy(
            update={"request_ms": round(request_ms(c.ms, c.prefill_ms_per_token, workload), 1)}
        )
        for d, c in choice.costs.items()
    }
    chosen, reason = pick(costs, workload=workload)
    return choice.model_copy(
        update={"workload": workload, "costs": costs, "chosen": chosen, "reason": reason}
    )


def pick(
    costs: dict[str, DtypeCost], min_gain: float = MIN_GAIN, workload: Workload | None = None
) -> tuple[str, str]:
    """(dtype, reason): the cheapest request; float32 unless another beats it by `min_gain`.

    Example: float32 {1: 60 ms, prefill 2.45 ms/token, request 8415 ms}, bfloat16 {1: 38 ms,
    1.70 ms/token, 5374 ms} -> ("torch.bfloat16", "... bfloat16 1.57x cheaper"); bfloat16 at
    {1: 50 ms, 16 ms/token} costs 11200 ms -> ("torch.float32", "... float32 (cheapest)").
    """
    fp32 = "torch.float32"
    rows = workload.rows if workload is not None else 1
    best = min(costs, key=lambda d: costs[d].request_ms)
    step = "decode" if rows == 1 else f"decode at {rows} rows"
    figures = "; ".join(
        f"{d.removeprefix('torch.')}: {step} {step_ms(c.ms, rows) / rows:.1f} ms/token, prefill "
        f"{c.prefill_ms_per_token:.2f} ms/token, request {c.request_ms / 1000:.2f} s"
        for d, c in costs.items()
    )
    if fp32 not in costs:
        return best, f"{figures} (the only candidates on this device)"
    gain = costs[fp32].request_ms / costs[best].request_ms
    if best == fp32 or gain < min_gain:
        why = "cheapest" if best == fp32 else f"others within {min_gain:.2f}x, fp32 is exact"
        return fp32, f"{figures}: float32 ({why})"
    return best, f"{figures}: {best.removeprefix('torch.')} {gain:.2f}x cheaper"


def measure_prefill(model, tokens: int = 128, repeats: int = 3) -> float:
    """Median ms per token of one forward over `tokens` prompt tokens into an empty cache."""
    vocab = model.config.vocab_size
    ids = [(11 * i + 5) % vocab for i in range(tokens)]
    times = []
    for _ in range(repeats + 1):
        cache = hf_internals.new_cache(model.config)
        sync_device(model.device)
        start = time.perf_counter()
        verify_forward(model, cache, 0, ids, Draft())
        sync_device(model.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1000 / tokens


def choice_path(cache_dir: Path, model_id: str, device, threads: int) -> Path:
    stem = cache_stem(model_id, device, f"t{threads}")
    return Path(cache_dir) / "costs" / f"dtype-{stem}.json"


def measure_choice(
    model, model_id: str, workload: Workload | None = None, context: int = 200, repeats: int = 5
) -> DtypeChoice:
    """Time 1-, 4- and 16-token verify forwards and a 128-token prefill of `model` in each
    candidate, and price `workload` with them."""
    workload = workload or Workload()
    costs: dict[str, DtypeCost] = {}
    for dtype in candidates(model.device):
        copy_ = model if model.dtype == dtype else copy.deepcopy(model).to(dtype)
        curve = measure_cost_curve(
            copy_, model_id, sizes=MEASURED_ROWS, context=context, repeats=repeats
        )
        prefill = measure_prefill(copy_)
        costs[str(dtype)] = DtypeCost(
            ms=curve.ms,
            prefill_ms_per_token=round(prefill, 4),
            request_ms=round(request_ms(curve.ms, prefill, workload), 1),
        )
        del copy_
    chosen, reason = pick(costs, workload=workload)
    return DtypeChoice(
        model_id=model_id,
        device=str(model.device),
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        context=context,
        workload=workload,
        costs=costs,
        chosen=chosen,
        reason=reason,
    )


def cached_choice(cache_dir: Path, model_id: str, device) -> DtypeChoice | None:
    """The cached choice, or None when absent, from another torch or an older format."""
    path = choice_path(cache_dir, model_id, device, torch.get_num_threads())
    if not path.exists():
        return None
    try:
        choice = DtypeChoice.model_validate(json.loads(path.read_text()))
    except (ValidationError, ValueError):
        return None
    ok = choice.torch_version == torch.__version__ and choice.format == FORMAT
    return choice if ok else None


def save_choice(cache_dir: Path, choice: DtypeChoice) -> Path:
    path = choice_path(cache_dir, choice.model_id, choice.device, choice.threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(choice.model_dump_json(indent=1))
    return path


def dtype_of(name: str) -> torch.dtype:
    """ "torch.bfloat16" -> torch.bfloat16."""
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")  # noqa: TRY004 - a bad name, not type
    return value
