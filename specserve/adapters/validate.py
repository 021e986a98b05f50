"""Validate a user's LoRA adapter directory against the served base model, loading nothing.

`validate_adapter(path, base, limits)` reads the config and the safetensors *header* (plus the
weight bytes, which are returned so the caller loads exactly what was checked, with the sha256 of
exactly those bytes) and raises one `AdapterError` subclass per reason; see errors.py.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from specserve.adapters.errors import (
    AdapterPathError,
    BaseModelMismatchError,
    CorruptAdapterError,
    MissingAdapterFileError,
    PickleFormatError,
    RankLimitError,
    SizeLimitError,
    TargetModuleError,
    UnsupportedAdapterError,
)
from specserve.adapters.fingerprint import contents_sha256
from specserve.adapters.settings import AdapterLimits

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.(?P<part>lora_A|lora_B)\.weight$")
_FLOAT_DTYPES = {"F32", "F16", "BF16"}


def module_of_key(key: str) -> tuple[str, str]:
    """(module, "lora_A" | "lora_B") of a peft state-dict key. Example:
    "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" ->
    ("model.layers.0.self_attn.q_proj", "lora_A"). ValueError for any other key."""
    match = _KEY.match(key)
    if match is None:
        raise UnsupportedAdapterError(f"tensor {key!r} is not a LoRA A/B weight")
    return match["module"], match["part"]


@dataclass(frozen=True)
class BaseModelSpec:
    """What an adapter must fit: accepted names and each Linear module's (out, in) shape."""

    names: frozenset[str]
    linear_shapes: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, model, names: list[str]) -> BaseModelSpec:
        shapes = {
            name: (module.out_features, module.in_features)
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear)
        }
        return cls(frozenset(n for n in names if n), shapes)


@dataclass(frozen=True)
class ValidatedAdapter:
    """An adapter that passed every check, with the exact bytes that were checked."""

    path: Path
    config: dict
    weights: bytes  # the safetensors file as validated; load from these, not from disk again
    rank: int
    target_modules: tuple[str, ...]
    sha256: str  # of the bytes read for the checks (config and `weights`), not re-read later

    @property
    def n_bytes(self) -> int:
        return len(self.weights)


def validate_adapter(
    path: str | Path, base: BaseModelSpec, limits: AdapterLimits
) -> ValidatedAdapter:
    """Every check, cheapest first; raises on the first failure. Nothing is imported or unpickled."""
    adapter_dir = _inside_root(Path(path), limits.root)
    _no_pickles_or_escapes(adapter_dir, limits.root)
    raw_config, config = _read_config(adapter_dir, limits)
    weights = _read_weights(adapter_dir, limits)
    _check_config(config, base, limits)
    header = _safetensors_header(weights)
    rank, modules = _check_tensors(header, base, limits)
    _check_targets(config, base, modules)
    return ValidatedAdapter(
        path=adapter_dir,
        config=config,
        weights=weights,
        rank=rank,
        target_modules=tuple(sorted({m.rsplit(".", 1)[-1] for m in modules})),
        sha256=contents_sha256(raw_config, weights),
    )


def _inside_root(path: Path, root: Path) -> Path:
    """The real directory `path` names (relative paths are under root), if it stays in root."""
    real_root = root.resolve()
    candidate = path if path.is_absolute() else real_root / path
    if ".." in candidate.parts:
        raise AdapterPathError(f"adapter path {str(path)!r}: '..' is not allowed")
    real = candidate.resolve()
    if real != real_root and real_root not in real.parents:
        raise AdapterPathError(
            f"adapter path {str(path)!r} is outside the adapter root {str(root)!r}"
        )
    if not real.is_dir():
        raise AdapterPathError(f"adapter path {str(path)!r} is not a directory under {str(root)!r}")
    return real


def _no_pickles_or_escapes(adapter_dir: Path, root: Path) -> None:
    real_root = root.resolve()
    for entry in sorted(adapter_dir.rglob("*")):
        if entry.is_symlink():
            target = entry.resolve()
            if target != real_root and real_root not in target.parents:
                raise AdapterPathError(
                    f"adapter file {entry.name!r} links outside the adapter root"
                )
        if entry.suffix.lower() in PICKLE_SUFFIXES:
            raise PickleFormatError(
                f"adapter file {entry.name!r} is a pickle format; only {WEIGHTS_FILE} is accepted"
            )


def _read_file(adapter_dir: Path, name: str, limit: int) -> bytes:
    path = adapter_dir / name
    if not path.is_file():
        raise MissingAdapterFileError(f"adapter is missing {name}")
    size = path.stat().st_size
    if size > limit:
        raise SizeLimitError(f"adapter {name} is {size} bytes; the limit is {limit}")
    return path.read_bytes()


def _read_config(adapter_dir: Path, limits: AdapterLimits) -> tuple[bytes, dict]:
    raw = _read_file(adapter_dir, CONFIG_FILE, limits.max_config_bytes)
    try:
        config = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptAdapterError(f"adapter {CONFIG_FILE} is not valid JSON: {err}") from None
    if not isinstance(config, dict):
        raise CorruptAdapterError(f"adapter {CONFIG_FILE} must hold a JSON object")
    return raw, config


def _read_weights(adapter_dir: Path, limits: AdapterLimits) -> bytes:
    return _read_file(adapter_dir, WEIGHTS_FILE, limits.max_bytes)


def _check_config(config: dict, base: BaseModelSpec, limits: AdapterLimits) -> None:
    if config.get("peft_type") != "LORA":
        raise UnsupportedAdapterError(f"peft_type {config.get('peft_type')!r}: only LORA is served")
    for key in ("use_dora", "modules_to_save", "layer_replication", "trainable_token_indices"):
        if config.get(key):
            raise UnsupportedAdapterError(f"adapter config {key}={config[key]!r} is not served")
    ranks = [config.get("r", 8), *(config.get("rank_pattern") or {}).values()]
    if not all(isinstance(r, int) and r > 0 for r in ranks):
        raise CorruptAdapterError(f"adapter ranks {ranks} must be positive integers")
    if max(ranks) > limits.max_rank:
        raise RankLimitError(f"adapter rank {max(ranks)} exceeds the limit {limits.max_rank}")
    name = config.get("base_model_name_or_path")
    if name not in base.names:
        raise BaseModelMismatchError(
            f"adapter was made for base model {name!r}; this server's base is one of {sorted(base.names)}"
        )


def _safetensors_header(data: bytes) -> dict:
    """Parse and bounds-check the header: u64 length, JSON {name: {dtype, shape, data_offsets}}."""
    if len(data) < 8:
        raise CorruptAdapterError(f"{WEIGHTS_FILE} is truncated ({len(data)} bytes)")
    (length,) = struct.unpack("<Q", data[:8])
    if length > len(data) - 8:
        raise CorruptAdapterError(f"{WEIGHTS_FILE} header claims {length} bytes; file is shorter")
    try:
        header = json.loads(data[8 : 8 + length])
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptAdapterError(f"{WEIGHTS_FILE} header is not valid JSON: {err}") from None
    if not isinstance(header, dict):
        raise CorruptAdapterError(f"{WEIGHTS_FILE} header must be a JSON object")
    header.pop("__metadata__", None)
    body = len(data) - 8 - length
    for name, info in header.items():
        try:
            start, end = info["data_offsets"]
            numel = 1
            for dim in info["shape"]:
                numel *= int(dim)
            size = {"F32": 4, "F16": 2, "BF16": 2}.get(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise CorruptAdapterError(f"{WEIGHTS_FILE} entry {name!r} is malformed") from None
        if size is None:
            raise UnsupportedAdapterError(
                f"tensor {name!r} has dtype {info['dtype']}; need {_FLOAT_DTYPES}"
            )
        if not (0 <= start <= end <= body) or end - start != numel * size:
            raise CorruptAdapterError(
                f"{WEIGHTS_FILE} tensor {name!r} lies outside the file or is cut"
            )
    return header


def _check_tensors(
    header: dict, base: BaseModelSpec, limits: AdapterLimits
) -> tuple[int, set[str]]:
    """Each tensor is a lora_A [r, in] / lora_B [out, r] of a base Linear; returns (max r, modules)."""
    if not header:
        raise CorruptAdapterError(f"{WEIGHTS_FILE} holds no tensors")
    ranks: dict[str, set[int]] = {}
    for name, info in header.items():
        match = _KEY.match(name)
        if match is None:
            raise UnsupportedAdapterError(f"tensor {name!r} is not a LoRA A/B weight")
        module, part, shape = match["module"], match["part"], [int(d) for d in info["shape"]]
        if module not in base.linear_shapes:
            raise BaseModelMismatchError(
                f"tensor {name!r}: the base model has no Linear {module!r}"
            )
        out_features, in_features = base.linear_shapes[module]
        if len(shape) != 2 or (
            shape[1] != in_features if part == "lora_A" else shape[0] != out_features
        ):
            want = f"[r, {in_features}]" if part == "lora_A" else f"[{out_features}, r]"
            raise BaseModelMismatchError(
                f"tensor {name!r} has shape {shape}; the base needs {want}"
            )
        ranks.setdefault(module, set()).add(shape[0] if part == "lora_A" else shape[1])
    for module, rs in ranks.items():
        if len(rs) != 1:
            raise CorruptAdapterError(
                f"module {module!r}: lora_A and lora_B ranks differ ({sorted(rs)})"
            )
    rank = max(r for rs in ranks.values() for r in rs)
    if rank > limits.max_rank:
        raise RankLimitError(f"adapter tensors have rank {rank}; the limit is {limits.max_rank}")
    return rank, set(ranks)


def _check_targets(config: dict, base: BaseModelSpec, modules: set[str]) -> None:
    """Config targets must name base modules (peft's rule: equal, or a '.'-suffix; a str is a regex)."""
    targets = config.get("target_modules")
    names = list(base.linear_shapes)
    if isinstance(targets, str):
        if not any(re.fullmatch(targets, n) for n in names):
            raise TargetModuleError(
                f"target_modules regex {targets!r} matches no module of the base"
            )
        return
    if not isinstance(targets, list) or not targets:
        raise TargetModuleError(
            f"target_modules must be a non-empty list or a regex, not {targets!r}"
        )
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
        raise TargetModuleError(
            f"target_modules {missing} are not in the base model; it has {leaves}"
        )
    untargeted = sorted(
        m for m in modules if not any(m == t or m.endswith("." + t) for t in targets)
    )
    if untargeted:
        raise CorruptAdapterError(f"weights for modules outside target_modules: {untargeted[:3]}")
