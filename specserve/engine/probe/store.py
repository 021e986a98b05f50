"""Probe results kept per (architecture class, its features, transformers version, probe
version): in this process, and as one JSON file each under a cache directory the caller names.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from specserve.engine.probe.result import PROBE_VERSION, ProbeResult

_SEEN: dict[str, ProbeResult] = {}  # key -> result, this process (a memo, not configuration)


def key(architecture: str, fingerprint: str, transformers_version: str) -> str:
    """Example: ("Starcoder2ForCausalLM", "3f2a9c01b7de", "5.24.0") ->
    "Starcoder2ForCausalLM-3f2a9c01b7de-tf5.24.0-probe1"."""
    return f"{architecture}-{fingerprint}-tf{transformers_version}-probe{PROBE_VERSION}"


def lookup(name: str, cache_dir: Path | None) -> ProbeResult | None:
    """The kept result of `name`: this process's, else the cache directory's (a file that does
    not parse is ignored and will be replaced)."""
    if name in _SEEN:
        return _SEEN[name]
    if cache_dir is None:
        return None
    path = Path(cache_dir) / f"{name}.json"
    try:
        result = ProbeResult.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None
    _SEEN[name] = result
    return result


def keep(name: str, result: ProbeResult, cache_dir: Path | None) -> None:
    """Remember `result`; write it atomically under `cache_dir` when given (best effort: a
    read-only cache leaves the result in this process only)."""
    _SEEN[name] = result
    if cache_dir is None:
        return
    with contextlib.suppress(OSError):
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(result.model_dump_json(indent=2))
        os.replace(tmp, Path(cache_dir) / f"{name}.json")


def forget() -> None:
    """Drop this process's memo (the files stay): the next lookup reads the directory."""
    _SEEN.clear()
