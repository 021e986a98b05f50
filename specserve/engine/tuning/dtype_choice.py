"""`--dtype auto`: the dtype whose real serving step (the scheduler over a Spec-Bench-shaped mix
under load, and one request alone, `dtype_serving`) generates the most tokens per second on this
device, measured once per (model, device, threads, load) and cached; never a CPU-flag guess.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pydantic import BaseModel, Field, ValidationError

from specserve.engine.tuning.cost import cache_stem
from specserve.engine.tuning.dtype_serving import ServingFigures, ServingMix, measure_serving

# fp32 is the exact mode: another dtype must beat it by this factor (noise margin)
MIN_GAIN = 1.05
# under load, a dtype at this fraction of fp32's speed or more is "as fast" (the 16-row run-to-run
# spread: 0.96-1.11x bf16/fp32 in four runs on a Zen 4), so its gain alone decides
LOAD_TIE = 0.93
FORMAT = 5  # 5: a tie under load goes to the faster alone; 4 under load only; 3 plain forwards


class Workload(BaseModel):
    """The load the choice is made at: a dtype slower than fp32 under it is never chosen, for a
    command alone as for a replica (one rule, so a drafter trains in the dtype it serves in)."""

    rows: int = Field(
        16,
        ge=1,
        description="requests decoding together in the timed serving step (a replica's batch "
        "under load; the 1-row figure is measured beside it)",
    )


class DtypeChoice(BaseModel):
    format: int = FORMAT
    model_id: str
    device: str
    threads: int
    torch_version: str
    workload: Workload
    costs: dict[str, ServingFigures]  # dtype name -> its measured serving step
    chosen: str
    reason: str


def candidates(device: torch.device) -> list[torch.dtype]:
    """The dtypes auto tries: CPU float32 and bfloat16; CUDA bfloat16 only."""
    if torch.device(device).type == "cuda":
        return [torch.bfloat16]
    return [torch.float32, torch.bfloat16]


def _short(name: str) -> str:
    return {"torch.float32": "fp32", "torch.bfloat16": "bf16"}.get(
        name, name.removeprefix("torch.")
    )


def pick(costs: dict[str, ServingFigures], min_gain: float = MIN_GAIN) -> tuple[str, str]:
    """(dtype, reason): float32 unless another dtype is `min_gain` faster under load, or as fast
    under load (>= `LOAD_TIE` x) and `min_gain` faster for one request alone.

    Examples (tok/s at 16 rows, 1 row; fp32 34.3, 28.0): bf16 40.0, 25.0 -> bf16 ("1.17x faster
    under load"), even if slower alone; bf16 30.7, 40.0 -> float32 (0.90x under load: never a
    dtype slower there); bf16 33.5, 40.0 -> bf16 ("as fast under load (0.98x), 1.43x alone").
    """
    fp32 = "torch.float32"
    rows = next(iter(costs.values())).rows
    order = sorted(costs, key=lambda d: d != "torch.bfloat16")  # bf16 first, as the reports read
    figures = f"{rows}-row serving step: " + ", ".join(
        f"{_short(d)} {costs[d].tok_s:.1f} tok/s" for d in order
    )
    figures += " (1 row: " + ", ".join(f"{_short(d)} {costs[d].alone_tok_s:.1f}" for d in order)
    figures += ")"
    best = max(costs, key=lambda d: costs[d].tok_s)
    if fp32 not in costs:
        return best, f"{figures}: {best.removeprefix('torch.')} (the only candidate on this device)"
    gain = costs[best].tok_s / costs[fp32].tok_s
    if best != fp32 and gain >= min_gain:
        return best, f"{figures}: {best.removeprefix('torch.')} {gain:.2f}x faster under load"
    tied = [d for d in costs if d != fp32 and costs[d].tok_s >= LOAD_TIE * costs[fp32].tok_s]
    alone = max(tied, key=lambda d: costs[d].alone_tok_s, default=None)
    if alone is not None and costs[alone].alone_tok_s >= min_gain * costs[fp32].alone_tok_s:
        load = costs[alone].tok_s / costs[fp32].tok_s
        fast = costs[alone].alone_tok_s / costs[fp32].alone_tok_s
        name = alone.removeprefix("torch.")
        return alone, f"{figures}: {name} (as fast under load ({load:.2f}x), {fast:.2f}x alone)"
    if best == fp32:
        return fp32, f"{figures}: float32 (faster under load)"
    return fp32, f"{figures}: float32 (others within {min_gain:.2f}x under load, fp32 is exact)"


def choice_path(cache_dir: Path, model_id: str, device, threads: int) -> Path:
    stem = cache_stem(model_id, device, f"t{threads}")
    return Path(cache_dir) / "costs" / f"dtype-{stem}.json"


def measure_choice(
    model, model_id: str, workload: Workload | None = None, mix: ServingMix | None = None
) -> DtypeChoice:
    """Time the serving step (`dtype_serving.measure_serving`) of `model` in each candidate at
    `workload.rows` rows and pick by it; `mix` overrides the rest of what is timed (tests)."""
    workload = workload or Workload()
    mix = (mix or ServingMix()).model_copy(update={"rows": workload.rows})
    costs = measure_serving(model, candidates(model.device), mix)
    chosen, reason = pick(costs)
    return DtypeChoice(
        model_id=model_id,
        device=str(model.device),
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        workload=workload,
        costs=costs,
        chosen=chosen,
        reason=reason,
    )


def cached_choice(
    cache_dir: Path, model_id: str, device, workload: Workload | None = None
) -> DtypeChoice | None:
    """The cached choice, or None when absent, from another torch, an older format or made at
    another load than `workload`'s."""
    path = choice_path(cache_dir, model_id, device, torch.get_num_threads())
    if not path.exists():
        return None
    try:
        choice = DtypeChoice.model_validate(json.loads(path.read_text()))
    except (ValidationError, ValueError):
        return None
    ok = choice.torch_version == torch.__version__ and choice.format == FORMAT
    return choice if ok and choice.workload == (workload or Workload()) else None


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
