"""Tests for specserve.paths: the default cache follows $SPECSERVE_CACHE; configs are packaged."""

from __future__ import annotations

from pathlib import Path

import pytest

from specserve.paths import CONFIG_DIR, config_file, default_cache_dir


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("SPECSERVE_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "specserve"


def test_config_file_is_inside_the_package_and_unknown_names_list_the_shipped():
    assert config_file("serve.yaml").parent == CONFIG_DIR
    with pytest.raises(FileNotFoundError, match="models.yaml, policy.yaml, serve.yaml"):
        config_file("nope.yaml")
