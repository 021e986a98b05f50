"""Whether the target forward is compiled: `decide` turns `--compile auto|on|off` and the cached
measurement of an earlier warm-up (`CompileRecord`, per model, device, dtype, threads and torch)
into a decision with its reason; never a guess from the device kind.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pydantic import BaseModel

from specserve.engine.compiled import CompileRecord
from specserve.engine.cost import cache_stem

MIN_GAIN = 1.05  # `auto` compiles when the compiled 1-token forward is at least this much cheaper


class CompileDecision(BaseModel):
    enabled: bool
    reason: str


def decide(mode: str, record: CompileRecord | None, dtype: torch.dtype) -> CompileDecision:
    """Whether to compile, and why. `auto` follows the cached measurement only.

    Example: auto, record gain 1.49, bf16 -> on ("measured 1.49x ..."); auto, no record -> off.
    """
    if mode in ("on", "off"):
        return CompileDecision(enabled=mode == "on", reason=f"compile {mode}")
    if record is None:
        return CompileDecision(
            enabled=False, reason="auto: not measured here yet (`specserve tune --compile on`)"
        )
    measured = (
        f"measured compiled {record.compiled_ms[1]:.1f} ms vs eager {record.eager_ms[1]:.1f} ms "
        f"per 1-token forward ({record.gain:.2f}x), first start {record.start_s:.0f} s"
    )
    if record.gain < MIN_GAIN:
        return CompileDecision(enabled=False, reason=f"auto: {measured}, below {MIN_GAIN}x")
    if dtype == torch.float32 and not record.bit_exact:
        return CompileDecision(
            enabled=False,
            reason=f"auto: {measured}, but not bit-exact in float32 (max |diff| "
            f"{record.max_abs_diff:.3g}); float32 is the exact mode",
        )
    return CompileDecision(enabled=True, reason=f"auto: {measured}")


def record_path(cache_dir: Path, model_id: str, device, dtype) -> Path:
    stem = cache_stem(model_id, device, f"{dtype}-t{torch.get_num_threads()}")
    return Path(cache_dir) / "costs" / f"compile-{stem}.json"


def cached_record(cache_dir: Path, model_id: str, device, dtype) -> CompileRecord | None:
    """The measurement of an earlier warm-up in this configuration (None if absent or from
    another torch version)."""
    path = record_path(cache_dir, model_id, device, dtype)
    if not path.exists():
        return None
    record = CompileRecord.model_validate(json.loads(path.read_text()))
    return record if record.torch == torch.__version__ else None


def save_record(cache_dir: Path, record: CompileRecord) -> Path:
    path = record_path(cache_dir, record.model_id, record.device, record.dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.model_dump_json(indent=1))
    return path
