"""Limits on user adapters, passed down per server (never module-global)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class AdapterLimits(BaseModel):
    """What an adapter may be, and how many may stay resident on one base model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    root: Path = Field(description="adapters load only from inside this directory")
    max_rank: int = Field(64, gt=0, description="largest LoRA rank accepted")
    max_bytes: int = Field(256 * 2**20, gt=0, description="largest adapter_model.safetensors")
    max_config_bytes: int = Field(2**20, gt=0, description="largest adapter_config.json")
    max_resident: int = Field(8, gt=0, description="adapters kept loaded at once (LRU)")
    max_resident_bytes: int = Field(1024 * 2**20, gt=0, description="their total weight bytes")
