"""Limits on user adapters, passed down per server (never module-global): what an adapter may be,
and how much memory the adapters resident on one base model may take."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class AdapterLimits(BaseModel):
    """What an adapter may be, and how many bytes of them stay resident on one base model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    root: Path = Field(description="adapters load only from inside this directory")
    max_rank: int = Field(64, gt=0, description="largest LoRA rank accepted")
    max_bytes: int = Field(256 * 2**20, gt=0, description="largest adapter_model.safetensors")
    max_config_bytes: int = Field(2**20, gt=0, description="largest adapter_config.json")
    resident_memory_fraction: float = Field(
        0.2,
        gt=0,
        le=0.9,
        description="resident adapter weights may take this share of the memory free on the "
        "model's device when the server starts (unless max_resident_bytes is set)",
    )
    max_resident_bytes: int | None = Field(
        None, gt=0, description="a fixed byte budget for resident adapter weights"
    )
    max_resident: int | None = Field(
        None, gt=0, description="an extra cap on the resident count (None: bytes alone decide)"
    )
