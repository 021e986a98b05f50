"""Load a model to serve: a catalog name (pulled first), an HF model dir or a .gguf file.

`load_model(name_or_path)` returns an eval-mode, grad-free HF causal LM plus tokenizer and eos ids,
or raises `ModelLoadError` naming the model/file that could not be loaded; `model_family` says,
from the config alone, whether and why the architecture is served (known-good or probed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers

from specserve.engine import families, hf_internals
from specserve.engine.tuning import dtype_choice
from specserve.models.catalog import ModelLoadError, load_catalog
from specserve.models.eos import eos_ids, id_list
from specserve.models.provision import pull_model
from specserve.paths import default_cache_dir

log = logging.getLogger(__name__)

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
_WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")


def resolve_device(device: str | None) -> torch.device:
    """None -> cuda if available else cpu; validates explicit cuda requests."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"invalid device {device!r}: {e}") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r} requested but only {torch.cuda.device_count()} CUDA device(s)"
            )
    return dev


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """None -> float32 on cpu, bfloat16 on cuda; else float32/fp32, bfloat16/bf16, float16/fp16."""
    if dtype is None:
        if torch.device(device).type == "cuda":
            return torch.bfloat16
        return torch.float32
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid names: auto, {', '.join(_DTYPES)}")
    return _DTYPES[key]


@dataclass
class LoadedModel:
    model: transformers.PreTrainedModel  # eval mode, requires_grad off
    tokenizer: transformers.PreTrainedTokenizerBase
    model_id: str  # catalog name, or resolved path
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: frozenset[int]
    dtype_choice: Any = None  # dtype_choice.DtypeChoice when loaded with dtype="auto"


def _weights_desc(model_dir: Path) -> str:
    files = sorted({p.name for g in _WEIGHT_GLOBS for p in model_dir.glob(g)})
    if not files:
        return str(model_dir)
    return ", ".join(str(model_dir / f) for f in files)


def _finish(
    model: transformers.PreTrainedModel,
    tok: Any,
    model_id: str,
    dev: torch.device,
    dt: torch.dtype,
    where: str,
) -> LoadedModel:
    try:
        model = model.to(dev)
    except Exception as e:  # e.g. CUDA OOM
        raise ModelLoadError(f"cannot move model {where} to {dev}: {e}") from e
    model.eval()
    model.requires_grad_(False)
    eos = eos_ids(model, tok)
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None:
        pad = getattr(tok, "pad_token_id", None)
        if pad is None:
            eos_gen = id_list(gen.eos_token_id)
            pad = eos_gen[0] if eos_gen else (min(eos) if eos else None)
        gen.pad_token_id = pad
    return LoadedModel(
        model=model, tokenizer=tok, model_id=model_id, device=dev, dtype=dt, eos_token_ids=eos
    )


def _load_hf_dir(model_dir: Path, model_id: str, dev: torch.device, dt: torch.dtype) -> LoadedModel:
    try:
        config = transformers.AutoConfig.from_pretrained(str(model_dir))
    except Exception as e:
        raise ModelLoadError(f"cannot read {model_dir / 'config.json'}: {e}") from e
    _check_family(config, str(model_dir))
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as e:
        raise ModelLoadError(f"cannot load tokenizer from {model_dir}: {e}") from e
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dt)
    except Exception as e:
        raise ModelLoadError(
            f"cannot load model weights from {_weights_desc(model_dir)}: {type(e).__name__}: {e}"
        ) from e
    return _finish(model, tok, model_id, dev, dt, str(model_dir))


def _load_gguf(path: Path, dev: torch.device, dt: torch.dtype) -> LoadedModel:
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dt
        )
    except Exception as e:
        raise ModelLoadError(f"cannot load GGUF file {path}: {type(e).__name__}: {e}") from e
    hf_internals.strip_quantizer(model)
    _check_family(model.config, str(path))
    return _finish(model, tok, str(path), dev, dt, str(path))


def probe_dir() -> Path:
    """Where conformance-probe results are kept: $SPECSERVE_CACHE/probe."""
    return default_cache_dir() / "probe"


def _check_family(config, where: str) -> families.Family:
    """Admit the architecture now (known-good, or by the conformance probe, run once per
    architecture and kept under `probe_dir()`), or refuse it with the probe's failing check."""
    try:
        family = families.family_of(config, probe_dir())
    except families.UnsupportedModel as e:
        raise ModelLoadError(f"cannot serve {where}: {e}") from e
    if family.admitted == families.BY_PROBE:
        log.info("%s: %s %s", where, family.name, family.reason)
    return family


def model_family(name_or_path: str, cache_dir: Path | None = None) -> families.Family:
    """The family `load_model(name_or_path)` would serve the model as, read from its config
    (a catalog name is pulled first); raises ModelLoadError naming why it is refused."""
    path = Path(str(name_or_path)).expanduser()
    if not path.exists() and str(name_or_path) in load_catalog():
        path = pull_model(str(name_or_path), cache_dir)
    try:
        if path.suffix.lower() == ".gguf":
            config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        else:
            config = transformers.AutoConfig.from_pretrained(str(path))
    except Exception as e:
        raise ModelLoadError(f"cannot read the config of {name_or_path}: {e}") from e
    return _check_family(config, str(name_or_path))


def _load_path(path: Path, dev: torch.device, dt: torch.dtype) -> LoadedModel:
    """An existing HF model dir or .gguf file."""
    path = path.resolve()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is a directory without config.json, not an HF model dir")
        return _load_hf_dir(path, str(path), dev, dt)
    if path.suffix.lower() == ".gguf":
        return _load_gguf(path, dev, dt)
    raise ModelLoadError(
        f"{path} is neither a catalog name, an HF model directory nor a .gguf file"
    )


def load_model(
    name_or_path: str,
    *,
    device: str | None = None,
    dtype: str | None = None,
    cache_dir: Path | None = None,
    workload=None,
) -> LoadedModel:
    """Load a catalog model (pulling it if needed), an HF model dir, or a .gguf file.

    dtype "auto": the dtype whose measured serving step is fastest on this device under
    `workload`'s load (`dtype_choice`, cached; a `dtype_choice.Workload`, default 16 rows);
    None: float32 on CPU (the exact mode), bfloat16 on CUDA.
    """
    if str(dtype).strip().lower() == "auto":
        return _load_auto(name_or_path, device, cache_dir, workload)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    path = Path(str(name_or_path)).expanduser()
    try:
        catalog = load_catalog()
    except ModelLoadError:
        if not path.exists():
            raise
        catalog = {}
    if str(name_or_path) in catalog:
        model_dir = pull_model(str(name_or_path), cache_dir)
        return _load_hf_dir(model_dir, str(name_or_path), dev, dt)
    if not path.exists():
        raise ModelLoadError(
            f"model {str(name_or_path)!r} not found; known catalog names: "
            f"{', '.join(sorted(catalog)) or '(none)'}"
        )
    return _load_path(path, dev, dt)


def _load_auto(
    name_or_path: str, device: str | None, cache_dir: Path | None, workload
) -> LoadedModel:
    """Load in float32, then cast to the dtype whose serving step is fastest at `workload`'s load
    (cached, or measured now and cached)."""
    workload = workload or dtype_choice.Workload()
    loaded = load_model(name_or_path, device=device, dtype="float32", cache_dir=cache_dir)
    cache = cache_dir or default_cache_dir()
    choice = dtype_choice.cached_choice(cache, loaded.model_id, loaded.device, workload)
    if choice is None:
        choice = dtype_choice.measure_choice(loaded.model, loaded.model_id, workload)
        dtype_choice.save_choice(cache, choice)
    chosen = dtype_choice.dtype_of(choice.chosen)
    if chosen != loaded.dtype:
        loaded.model.to(chosen)
        loaded.dtype = chosen
    loaded.dtype_choice = choice
    return loaded
