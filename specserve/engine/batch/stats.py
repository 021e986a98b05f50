"""What one engine loop reports (`Scheduler.stats`): its queue and batch now, and where its time
went since it started (the replica's batch figures in metrics)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class BatchStats(BaseModel):
    """A snapshot of the engine loop: requests by phase, KV use, and cumulative step totals."""

    model_config = ConfigDict(frozen=True)

    waiting: int
    prefilling: int
    decoding: int
    kv_reserved_tokens: int
    kv_columns: int
    steps: int
    # since start: where the loop's time went
    decode_steps: int
    decode_rows: int
    decode_seconds: float
    prefill_tokens: int
    shared_prefill_tokens: int  # prompt tokens n choices did not compute again
    prefill_seconds: float
    calls_seconds: float  # model changes run between steps (adapter hand-overs)
    draft_cap: int | None  # the draft cap load put on the last step (None: none)

    @property
    def active(self) -> int:
        """Requests the loop holds: waiting, prefilling or decoding."""
        return self.waiting + self.prefilling + self.decoding
