"""The model a command serves, built by the composition root (platform/serving.py) from its flags:
`load_command_target` loads it with `--adapter` resident under one name; `compile_forward`
applies `--compile` to its single-request verify forward."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specserve.adapters.settings import AdapterLimits
from specserve.cli.common import cache_dir, from_flags, log
from specserve.engine.forward import compiled
from specserve.engine.lora.batch import takes_adapters
from specserve.engine.tuning import compile_choice
from specserve.platform.serving import ServedModel, TargetSettings, load_target

ADAPTER_NAME = "adapter@1"  # the resident name of a command line --adapter


@dataclass(frozen=True)
class CommandTarget:
    """A command's loaded model and its --adapter: the resident name and the sha256 drafters are
    keyed to (both None without --adapter)."""

    served: ServedModel
    adapter: str | None = None
    adapter_sha256: str | None = None

    @property
    def loaded(self):
        return self.served.loaded


def target_settings(args, dtype: str | None = None) -> TargetSettings:
    """The model flags (and --adapter, allowed from its own directory) as the root's settings."""
    adapter = getattr(args, "adapter", None)
    return from_flags(
        TargetSettings,
        args,
        source=str(args.model),
        dtype=dtype or args.dtype,
        float32_logits=getattr(args, "logits", "model") == "float32",
        cache_dir=cache_dir(args),
        adapters=AdapterLimits(root=Path(adapter).resolve().parent) if adapter else None,
    )


def load_command_target(args, dtype: str | None = None) -> CommandTarget:
    """The served model (in `dtype` instead of --dtype when given) and, with --adapter DIR, its
    LoRA adapter validated (safetensors only, matching base, limits) and made resident."""
    served = load_target(target_settings(args, dtype), log)
    if served.adapters is None:
        return CommandTarget(served)
    path = Path(args.adapter).resolve()
    checked = served.adapters.ensure(ADAPTER_NAME, path)
    log(f"adapter {path} (rank {checked.rank}, sha256 {checked.sha256[:12]}) loaded")
    return CommandTarget(served, ADAPTER_NAME, checked.sha256)


def compile_forward(args, served: ServedModel, features: bool = False) -> dict:
    """Compile the target's verify forward when `--compile` decides so (warming it now, with the
    measurement cached for `auto`); returns the bench/tune record of what was decided."""
    loaded, mode = served.loaded, getattr(args, "compile", "off")
    record = compile_choice.cached_record(
        served.cache_dir, loaded.model_id, loaded.device, loaded.dtype
    )
    decision = compile_choice.decide(mode, record, loaded.dtype)
    if decision.enabled and takes_adapters(loaded.model) and mode == "auto":
        decision = compile_choice.CompileDecision(
            enabled=False, reason="auto: a model with a LoRA adapter stays eager"
        )
    log(f"compile {'on' if decision.enabled else 'off'} ({decision.reason})")
    if not decision.enabled:
        return {"enabled": False, "reason": decision.reason}
    # compiled graphs persist beside the other caches, so only the first start pays inductor
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(served.cache_dir / "inductor"))
    settings = compiled.CompileSettings(
        features=features, inductor_mode=getattr(args, "compile_mode", "default")
    )
    target = compiled.attach(loaded.model, settings)
    last = f" (last time {record.start_s:.0f} s)" if record is not None else ""
    log(f"compiling the verify forward{last}; this can take minutes on a CPU ...")
    record = target.warm(loaded.model_id)
    compile_choice.save_record(served.cache_dir, record)
    log(
        f"compiled in {record.start_s:.0f} s; ms per forward eager -> compiled: "
        + ", ".join(
            f"{k}: {record.eager_ms[k]:.1f} -> {v:.1f}" for k, v in record.compiled_ms.items()
        )
        + f"; max |logit diff| vs eager {record.max_abs_diff:.3g}; {record.graphs} graphs, "
        f"on-disk caches {record.cache_hits}"
    )
    return {"enabled": True, "reason": decision.reason, "record": record.model_dump()}
