import pytest

from specserve.adapters.fingerprint import adapter_sha256


def _write(d, config=b"{}", weights=b"w"):
    d.mkdir(exist_ok=True)
    (d / "adapter_config.json").write_bytes(config)
    (d / "adapter_model.safetensors").write_bytes(weights)
    return d


def test_same_bytes_same_fingerprint_any_location(tmp_path):
    assert adapter_sha256(_write(tmp_path / "a")) == adapter_sha256(_write(tmp_path / "b"))


@pytest.mark.parametrize("change", [{"config": b'{"r": 8}'}, {"weights": b"w2"}])
def test_any_byte_change_changes_fingerprint(tmp_path, change):
    assert adapter_sha256(_write(tmp_path / "a")) != adapter_sha256(
        _write(tmp_path / "b", **change)
    )


def test_missing_file_raises(tmp_path):
    d = _write(tmp_path / "a")
    (d / "adapter_model.safetensors").unlink()
    with pytest.raises(FileNotFoundError):
        adapter_sha256(d)


def test_format_is_name_length_bytes_of_each_file_in_order(tmp_path):
    """Fingerprints are stored: the streamed hash equals the one over whole files it replaced."""
    import hashlib

    d = _write(tmp_path / "a", config=b'{"r": 8}', weights=bytes(range(256)) * 5000)
    reference = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        data = (d / name).read_bytes()
        reference.update(f"{name}\0{len(data)}\0".encode() + data)
    assert adapter_sha256(d) == reference.hexdigest()


def test_fingerprint_of_bytes_read_equals_the_directory_fingerprint(tmp_path):
    from specserve.adapters.fingerprint import contents_sha256

    d = _write(tmp_path / "a", config=b'{"r": 8}', weights=bytes(range(256)) * 7)
    assert contents_sha256(b'{"r": 8}', bytes(range(256)) * 7) == adapter_sha256(d)
    assert contents_sha256(b"{}", b"w") != adapter_sha256(d)
