"""Whether the target forward is compiled: `decide` turns `--compile auto|on|off` and the cached
measurement of an earlier warm-up (`CompileRecord` of the verify forward, `BatchCompileRecord` of
the batched one; per model, device, dtype, threads and torch) into a decision with its reason;
never a guess from the device kind.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pydantic import BaseModel

from specserve.engine.forward.compiled import CompileRecord
from specserve.engine.forward.compiled_batch import BatchCompileRecord
from specserve.engine.tuning.cost import cache_stem

Record = CompileRecord | BatchCompileRecord

MIN_GAIN = 1.05  # `auto` compiles when the compiled 1-token forward is at least this much cheaper


class CompileDecision(BaseModel):
    enabled: bool
    reason: str


def decide(mode: str, record: Record | None, dtype: torch.dtype) -> CompileDecision:
    """Whether to compile, and why. `auto` follows the cached measurement only (the single verify
    forward's `CompileRecord` at 1 row, or the batched forward's `BatchCompileRecord` at its
    widest measured batch).

    Example: auto, record gain 1.49, bf16 -> on ("measured 1.49x ..."); auto, no record -> off.
    """
    if mode in ("on", "off"):
        return CompileDecision(enabled=mode == "on", reason=f"compile {mode}")
    if record is None:
        return CompileDecision(
            enabled=False, reason="auto: not measured here yet (`specserve tune --compile on`)"
        )
    at = 1 if isinstance(record, CompileRecord) else max(record.compiled_ms)
    what = "1-token forward" if isinstance(record, CompileRecord) else f"{at}-row batched step"
    measured = (
        f"measured compiled {record.compiled_ms[at]:.1f} ms vs eager {record.eager_ms[at]:.1f} ms "
        f"per {what} ({record.gain:.2f}x), first start {record.start_s:.0f} s"
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


def record_path(cache_dir: Path, model_id: str, device, dtype, batched: bool = False) -> Path:
    stem = cache_stem(model_id, device, f"{dtype}-t{torch.get_num_threads()}")
    return Path(cache_dir) / "costs" / f"compile-{'batch-' if batched else ''}{stem}.json"


def cached_record(
    cache_dir: Path, model_id: str, device, dtype, batched: bool = False
) -> Record | None:
    """The measurement of an earlier warm-up in this configuration (None if absent or from
    another torch version); `batched`: the batched forward's."""
    path = record_path(cache_dir, model_id, device, dtype, batched)
    if not path.exists():
        return None
    kind = BatchCompileRecord if batched else CompileRecord
    record = kind.model_validate(json.loads(path.read_text()))
    return record if record.torch == torch.__version__ else None


def save_record(cache_dir: Path, record: Record) -> Path:
    batched = isinstance(record, BatchCompileRecord)
    path = record_path(cache_dir, record.model_id, record.device, record.dtype, batched)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.model_dump_json(indent=1))
    return path
