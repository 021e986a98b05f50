"""`--dtype auto`: the dtype whose 1-token forward is fastest on this device, measured once per
(model, device, threads) and cached beside the cost curves; never a CPU-flag guess (bf16 is
natively fast on some CPUs and 44-499x slower on AVX2-only ones, pytorch#146508).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from pydantic import BaseModel

from specserve.engine.cost import cache_stem, measure_cost_curve

# fp32 is the exact mode: another dtype must beat it by this factor to be chosen (noise margin)
MIN_GAIN = 1.05


class DtypeChoice(BaseModel):
    model_id: str
    device: str
    threads: int
    torch_version: str
    context: int
    ms: dict[str, dict[int, float]]  # dtype -> {k: ms of a k-token verify forward}
    chosen: str
    reason: str


def candidates(device: torch.device) -> list[torch.dtype]:
    """The dtypes auto tries: CPU float32 and bfloat16; CUDA bfloat16 only."""
    if torch.device(device).type == "cuda":
        return [torch.bfloat16]
    return [torch.float32, torch.bfloat16]


def pick(ms_at_1: dict[str, float], min_gain: float = MIN_GAIN) -> tuple[str, str]:
    """(dtype, reason): the fastest 1-token forward; float32 unless another beats it by min_gain.

    Example: {"torch.float32": 60.0, "torch.bfloat16": 38.0} -> ("torch.bfloat16", "... 1.58x ...");
    {"torch.float32": 60.0, "torch.bfloat16": 58.0} -> ("torch.float32", "... within 1.05x ...").
    """
    fp32 = "torch.float32"
    best = min(ms_at_1, key=ms_at_1.get)
    figures = ", ".join(f"{d.removeprefix('torch.')} {v:.1f} ms" for d, v in ms_at_1.items())
    if fp32 not in ms_at_1:
        return best, f"1-token forward {figures}; the only candidates on this device"
    gain = ms_at_1[fp32] / ms_at_1[best]
    if best == fp32 or gain < min_gain:
        why = "fastest" if best == fp32 else f"others within {min_gain:.2f}x, fp32 is exact"
        return fp32, f"1-token forward {figures}: float32 ({why})"
    return best, f"1-token forward {figures}: {best.removeprefix('torch.')} {gain:.2f}x faster"


def choice_path(cache_dir: Path, model_id: str, device, threads: int) -> Path:
    stem = cache_stem(model_id, device, f"t{threads}")
    return Path(cache_dir) / "costs" / f"dtype-{stem}.json"


def measure_choice(model, model_id: str, context: int = 200, repeats: int = 5) -> DtypeChoice:
    """Time 1- and 4-token verify forwards of `model` (any dtype) in each candidate dtype."""
    ms: dict[str, dict[int, float]] = {}
    for dtype in candidates(model.device):
        copy_ = model if model.dtype == dtype else copy.deepcopy(model).to(dtype)
        curve = measure_cost_curve(copy_, model_id, sizes=(1, 4), context=context, repeats=repeats)
        ms[str(dtype)] = curve.ms
        del copy_
    chosen, reason = pick({d: v[1] for d, v in ms.items()})
    return DtypeChoice(
        model_id=model_id,
        device=str(model.device),
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        context=context,
        ms=ms,
        chosen=chosen,
        reason=reason,
    )


def cached_choice(cache_dir: Path, model_id: str, device) -> DtypeChoice | None:
    path = choice_path(cache_dir, model_id, device, torch.get_num_threads())
    if not path.exists():
        return None
    choice = DtypeChoice.model_validate(json.loads(path.read_text()))
    return choice if choice.torch_version == torch.__version__ else None


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
