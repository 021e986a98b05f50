"""Tests for specserve.models.load: HF dirs and GGUF files load, or fail naming the file; device
and dtype resolution. Fast ones use a tiny random Llama."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from specserve.models.catalog import ModelLoadError
from specserve.models.load import LoadedModel, load_model, resolve_device, resolve_dtype


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, save_tiny_model_dir) -> Path:
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


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


def test_load_a_file_neither_dir_nor_gguf(tmp_path):
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="neither a catalog name"):
        load_model(str(other), device="cpu")


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
