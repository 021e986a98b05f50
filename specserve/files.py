"""Digests of files on disk, streamed (never read whole into memory)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of the file's bytes; FileNotFoundError if it is missing."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
