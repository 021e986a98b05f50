"""What the commands share: the model flags, settings from flags named like their fields,
KEY=VALUE overrides, the cache directory, a device's name for reports, and logging to stderr
(stdout carries each command's result)."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from specserve.paths import default_cache_dir

SettingsT = TypeVar("SettingsT", bound=BaseModel)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _parse_value(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_overrides(items: list[str], scoped: bool) -> dict:
    """["window=5"] -> {"window": 5}; scoped: ["lookahead.window=5"] -> {"lookahead": {"window": 5}}."""
    out: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"config: expected KEY=VALUE, got {item!r}")
        if scoped:
            strategy, dot, field = key.partition(".")
            if not dot:
                raise ValueError(f"config: expected STRATEGY.KEY=VALUE, got {item!r}")
            out.setdefault(strategy, {})[field] = _parse_value(value)
        else:
            out[key] = _parse_value(value)
    return out


def nested_overrides(items: list[str], settings: type[BaseModel]) -> dict:
    """Dotted KEY=VALUE pairs as the nested dict `settings` validates; a name that is not a field
    fails listing the valid ones at its level (below a field that is not a model, none checked).

    Example: ["eagle.feature_layers=[3,15,-1]", "trainer.lr=0.002"] over DrafterTrainSettings ->
    {"eagle": {"feature_layers": [3, 15, -1]}, "trainer": {"lr": 0.002}}.
    """
    out: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"config: expected KEY=VALUE, got {item!r}")
        names = key.split(".")
        model, level = settings, out
        for depth, name in enumerate(names):
            if model is not None and name not in model.model_fields:
                where = ".".join(names[:depth]) or "settings"
                valid = ", ".join(model.model_fields)
                raise ValueError(f"config: unknown {name!r} in {where}; valid: {valid}")
            model = _model_field(model, name)
            if depth < len(names) - 1:
                level = level.setdefault(name, {})
        level[names[-1]] = _parse_value(value)
    return out


def _model_field(model: type[BaseModel] | None, name: str) -> type[BaseModel] | None:
    """The pydantic model type of field `name` of `model`, None where it is not one."""
    annotation = model.model_fields[name].annotation if model is not None else None
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation if is_model else None


def from_flags(settings: type[SettingsT], args: argparse.Namespace, **given) -> SettingsT:
    """`settings` validated from the parsed flags named like its fields (`--max-new-tokens` fills
    `max_new_tokens`), and `given` for the fields whose value is not a flag's as parsed.

    Example: `from_flags(SamplingParams, args, stop=args.stop or [])` after `--top-k 5`.
    """
    flags = {name: getattr(args, name) for name in settings.model_fields if hasattr(args, name)}
    return settings.model_validate(flags | given)


def cache_dir(args) -> Path:
    """--cache-dir, else $SPECSERVE_CACHE or ~/.cache/specserve."""
    return args.cache_dir or default_cache_dir()


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The flags of every command that loads a model (read by `target.load_command_target`)."""
    p.add_argument("--model", default="smollm2-135m", help="catalog name, HF dir or .gguf file")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if present)")
    p.add_argument(
        "--dtype",
        default="auto",
        help="auto (fastest serving step under load measured on this device, cached) / float32 "
        "(exact) / bfloat16",
    )
    p.add_argument("--cache-dir", type=Path, default=None, help="default $SPECSERVE_CACHE")
    p.add_argument(
        "--logits",
        default="model",
        choices=["model", "float32"],
        help="float32: the LM head in float32 over a bf16 model's hidden states",
    )
    p.add_argument(
        "--compile",
        default="auto",
        choices=["auto", "on", "off"],
        help="torch.compile the single-request verify forward (auto: when a cached measurement "
        "here shows it >= 1.05x cheaper, and bit-exact in float32; `tune --compile on` measures)",
    )
    p.add_argument(
        "--compile-mode",
        default="default",
        choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
        help="torch.compile mode when compiling (reduce-overhead: CUDA-graph replay on a GPU)",
    )


def device_name(device) -> str:
    """What a report names the device: "cuda (NVIDIA H200)", "cpu (AMD EPYC ..., 2 threads)"."""
    import torch  # lazy: +1.4 s (torch)

    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    model_name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            ln.split(":", 1)[1].strip()
            for ln in cpuinfo.read_text().splitlines()
            if ln.startswith("model name")
        ]
        model_name = names[0] if names else model_name
    return f"cpu ({model_name}, {torch.get_num_threads()} threads)"
