"""Content fingerprint of a LoRA adapter directory: what a drafter or n-gram pool is keyed to.

`adapter_sha256(dir)` hashes the bytes of `adapter_config.json` and `adapter_model.safetensors`
(names included, in that order), so any change to config or weights gives a new fingerprint.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def adapter_sha256(adapter_dir: str | Path) -> str:
    """Hex sha256 over (name, length, bytes) of each adapter file; FileNotFoundError if one is missing."""
    digest = hashlib.sha256()
    for name in ADAPTER_FILES:
        data = (Path(adapter_dir) / name).read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()
