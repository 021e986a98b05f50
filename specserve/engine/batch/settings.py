"""Limits of one replica's engine loop (a pydantic model passed down; no torch import, so the
platform's settings can carry it into a Serve config without loading the engine)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BatchSettings(BaseModel):
    """How much one replica's loop holds; unknown keys fail."""

    model_config = ConfigDict(extra="forbid")

    max_batch: int = Field(32, ge=1, description="requests prefilling or decoding at once")
    max_queue: int = Field(64, ge=0, description="waiting requests; beyond this submit refuses")
    max_queue_per_tenant: int = Field(32, ge=0, description="waiting requests of one tenant")
    kv_tokens: int = Field(
        65536, ge=1, description="KV positions reserved by admitted requests (prompt + output)"
    )
    prefill_chunk: int = Field(
        256, ge=1, description="prompt tokens prefilled per step, over all new requests"
    )
    draft_reserve: int = Field(64, ge=0, description="KV positions reserved for a draft")
    niceness: int = Field(
        0,
        ge=0,
        le=19,
        description="added to the engine loop thread's (and its compute threads') niceness. 0 by "
        "default: measured on 2 shared cores, niceness 10 made both steps and the HTTP side's "
        "refusals slower (likely: a preempted compute thread stalls its partner at each barrier)",
    )
    cap_from_rows: int = Field(
        3,
        ge=1,
        description="cut drafts by load only from this many decoding rows; below, a strategy "
        "drafts as tuned for a single request (the cost model values no aux branch)",
    )
