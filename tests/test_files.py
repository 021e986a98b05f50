"""`file_sha256`: the hex digest of a file's bytes, streamed in chunks."""

from __future__ import annotations

import hashlib

import pytest

from specserve.files import file_sha256


def test_digest_of_a_file_larger_than_a_read_chunk(tmp_path):
    data = bytes(range(256)) * 5000  # 1.28 MB: several of file_digest's reads
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    assert file_sha256(str(path)) == file_sha256(path)


def test_a_missing_file_fails(tmp_path):
    with pytest.raises(FileNotFoundError):
        file_sha256(tmp_path / "absent")
