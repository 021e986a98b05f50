"""Content-addressed adapter storage: `freeze_adapter(src, root)` copies an adapter's files into
`<root>/by-sha256/<sha256>/` (a staging dir, then one atomic rename; files read-only), the copy a
registered version points at, so a source changed later cannot alter what that version serves.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specserve.adapters.fingerprint import ADAPTER_FILES, adapter_sha256

STORE_DIR = "by-sha256"
_STAGING = ".staging-"  # a crash leaves at most such a dir behind; it never names a copy


@dataclass(frozen=True)
class FrozenAdapter:
    """An adapter's immutable copy: its directory and the sha256 of the bytes in it."""

    path: Path
    sha256: str


def freeze_adapter(src_dir: str | Path, root: str | Path) -> FrozenAdapter:
    """Copy the fingerprinted files of `src_dir` into the store under `root`; an intact copy of
    the same bytes is reused, one whose bytes no longer match its name is replaced."""
    store = Path(root).resolve() / STORE_DIR
    store.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=_STAGING, dir=store))
    try:
        for name in ADAPTER_FILES:
            shutil.copyfile(Path(src_dir) / name, staging / name)
            (staging / name).chmod(0o444)
        staging.chmod(0o755)
        sha256 = adapter_sha256(staging)
        final = store / sha256
        if not _intact(final, sha256):
            _discard(final, store)
            try:
                staging.rename(final)
            except OSError:  # a concurrent registration of the same bytes renamed first
                if not _intact(final, sha256):
                    raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when it was renamed
    return FrozenAdapter(final, sha256)


def _intact(path: Path, sha256: str) -> bool:
    try:
        return adapter_sha256(path) == sha256
    except OSError:
        return False


def _discard(path: Path, store: Path) -> None:
    """Move a damaged copy out of its name (one rename), then delete it."""
    if not path.exists():
        return
    aside = Path(tempfile.mkdtemp(prefix=_STAGING, dir=store)) / path.name
    with contextlib.suppress(FileNotFoundError):  # a concurrent call moved it first
        path.rename(aside)
    shutil.rmtree(aside.parent, ignore_errors=True)
