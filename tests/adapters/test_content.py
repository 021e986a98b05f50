"""Content-addressed adapter copies: a copy holds exactly the source's bytes, read-only, named by
their sha256; the same bytes share one copy; crashed or damaged copies never break a later one."""

from __future__ import annotations

import os
import stat

import pytest

from specserve.adapters.content import STORE_DIR, freeze_adapter
from specserve.adapters.fingerprint import ADAPTER_FILES, adapter_sha256


def _source(d, weights=b"weights"):
    d.mkdir(parents=True, exist_ok=True)
    (d / "adapter_config.json").write_bytes(b'{"r": 4}')
    (d / "adapter_model.safetensors").write_bytes(weights)
    (d / "README.md").write_text("not fingerprinted: not copied")
    return d


def _copies(root):
    return sorted(p.name for p in (root / STORE_DIR).iterdir())


def test_the_copy_holds_the_source_bytes_read_only_and_outlives_source_edits(tmp_path):
    src = _source(tmp_path / "src")
    sha = adapter_sha256(src)
    frozen = freeze_adapter(src, tmp_path)
    assert frozen.sha256 == sha and frozen.path == (tmp_path / STORE_DIR / sha).resolve()
    assert sorted(p.name for p in frozen.path.iterdir()) == sorted(ADAPTER_FILES)
    for name in ADAPTER_FILES:
        assert (frozen.path / name).read_bytes() == (src / name).read_bytes()
        assert not os.stat(frozen.path / name).st_mode & (stat.S_IWUSR | stat.S_IWGRP)
    (src / "adapter_model.safetensors").write_bytes(b"rewritten")
    assert adapter_sha256(frozen.path) == sha


def test_same_bytes_twice_reuse_one_copy_other_bytes_get_their_own(tmp_path):
    first = freeze_adapter(_source(tmp_path / "a"), tmp_path)
    again = freeze_adapter(_source(tmp_path / "b"), tmp_path)
    assert again == first and _copies(tmp_path) == [first.sha256]
    other = freeze_adapter(_source(tmp_path / "c", weights=b"other"), tmp_path)
    assert other.sha256 != first.sha256
    assert _copies(tmp_path) == sorted([first.sha256, other.sha256])


def test_leftovers_of_a_crash_do_not_break_a_later_registration(tmp_path):
    src = _source(tmp_path / "src")
    sha = adapter_sha256(src)
    store = tmp_path / STORE_DIR
    crashed = store / ".staging-crashed"  # a crash between copying and renaming
    crashed.mkdir(parents=True)
    (crashed / "adapter_model.safetensors").write_bytes(b"wei")
    (store / sha).mkdir()  # and one that left an empty dir under the final name
    frozen = freeze_adapter(src, tmp_path)
    assert adapter_sha256(frozen.path) == sha
    assert _copies(tmp_path) == sorted([".staging-crashed", sha])  # no staging dir of its own


def test_a_damaged_copy_is_replaced_by_the_same_bytes_registered_again(tmp_path):
    src = _source(tmp_path / "src")
    frozen = freeze_adapter(src, tmp_path)
    weights = frozen.path / "adapter_model.safetensors"
    weights.chmod(0o644)
    weights.write_bytes(b"corrupted")
    assert freeze_adapter(src, tmp_path) == frozen
    assert adapter_sha256(frozen.path) == frozen.sha256 and _copies(tmp_path) == [frozen.sha256]


def test_a_missing_source_file_raises_and_leaves_no_copy(tmp_path):
    src = _source(tmp_path / "src")
    (src / "adapter_model.safetensors").unlink()
    with pytest.raises(FileNotFoundError):
        freeze_adapter(src, tmp_path)
    assert _copies(tmp_path) == []
