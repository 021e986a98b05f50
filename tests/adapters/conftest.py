"""Adapter fixtures: real peft LoRA adapter directories for the tiny test models."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import peft
import pytest
import torch

BASE_NAME = "tiny-llama"


def make_adapter_dir(
    root: Path,
    name: str,
    base,
    seed: int = 0,
    rank: int = 4,
    targets: tuple[str, ...] = ("q_proj", "v_proj", "down_proj"),
    scale: float = 1.0,
    base_name: str = BASE_NAME,
) -> Path:
    """Save a random non-zero LoRA adapter for `base` (a copy is wrapped; `base` is untouched)."""
    config = peft.LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=list(targets), init_lora_weights=False
    )
    torch.manual_seed(seed)
    wrapped = peft.get_peft_model(copy.deepcopy(base), config)
    with torch.no_grad():
        for n, p in wrapped.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.3 * scale)
    out = root / name
    wrapped.save_pretrained(out)
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = base_name
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return out


def merged_copy(base, adapter_dir: Path):
    """A plain model with the adapter's weights merged in (the reference an adapter must match)."""
    model = peft.PeftModel.from_pretrained(copy.deepcopy(base), adapter_dir)
    return model.merge_and_unload().eval()


@pytest.fixture
def adapter_root(tmp_path) -> Path:
    root = tmp_path / "adapters"
    root.mkdir()
    return root


@pytest.fixture
def make_adapter(adapter_root):
    """Factory: make_adapter(name, base, seed=0, rank=4, targets=..., scale=1.0, base_name=...)."""
    return lambda name, base, **kw: make_adapter_dir(adapter_root, name, base, **kw)


@pytest.fixture(scope="session")
def merge_adapter():
    """Factory: merge_adapter(base, adapter_dir) -> plain model with the adapter merged."""
    return merged_copy
