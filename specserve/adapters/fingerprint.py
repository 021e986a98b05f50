"""Content fingerprint of a LoRA adapter directory: what a drafter or n-gram pool is keyed to.

`adapter_sha256(dir)` hashes the bytes of `adapter_config.json` and `adapter_model.safetensors`
(names included, in that order), so any change to config or weights gives a new fingerprint;
`contents_sha256(config, weights)` is the same fingerprint of bytes already read.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def _header(name: str, size: int) -> bytes:
    return f"{name}\0{size}\0".encode()


def adapter_sha256(adapter_dir: str | Path) -> str:
    """Hex sha256 over (name, length, bytes) of each adapter file, streamed; FileNotFoundError if
    one is missing. The format is stored (registry records, drafter manifests): keep it."""
    digest = hashlib.sha256()
    for name in ADAPTER_FILES:
        with open(Path(adapter_dir) / name, "rb") as f:
            digest.update(_header(name, os.fstat(f.fileno()).st_size))
            hashlib.file_digest(f, lambda: digest)  # feeds the file into `digest`
    return digest.hexdigest()


def contents_sha256(config: bytes, weights: bytes) -> str:
    """`adapter_sha256` of a directory holding exactly these two files' bytes."""
    digest = hashlib.sha256()
    for name, data in zip(ADAPTER_FILES, (config, weights), strict=True):
        digest.update(_header(name, len(data)))
        digest.update(data)
    return digest.hexdigest()
