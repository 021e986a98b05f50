"""A variant's captured traffic in the registry store: `TrafficLog` adds served requests (only while
the variant exists, the sample's version is one of its versions and capture is on; atomic) into a
set bounded by the admin's `max_samples`, pruned by `retention_s` on every write and read, expiring
`retention_s` after the last write; `Registry.delete` removes it with the variant.
"""

from __future__ import annotations

import uuid

from pydantic import ConfigDict, Field

from specserve.platform.state.records import CaptureSettings
from specserve.platform.state.registry import TRAFFIC, Registry
from specserve.training.traffic import ServedExample


class TrafficSample(ServedExample):
    """One captured request of a variant: what `ServedExample` holds, plus which version served it
    with which strategy, and when (seconds since the epoch)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)  # every sample is its own member
    version: int = Field(ge=1)
    strategy: str
    at: float

    def clipped(self, max_chars: int) -> TrafficSample:
        """This sample with its prompt, each message and its answer cut to `max_chars`."""
        messages = None
        if self.messages is not None:
            messages = [m | {"content": m.get("content", "")[:max_chars]} for m in self.messages]
        return self.model_copy(
            update={
                "prompt": None if self.prompt is None else self.prompt[:max_chars],
                "messages": messages,
                "output": self.output[:max_chars],
            }
        )


class TrafficLog:
    """Captured traffic of the variants of `registry` (its store and namespace)."""

    def __init__(self, registry: Registry) -> None:
        self.registry, self.store = registry, registry.store

    def add(self, name: str, sample: TrafficSample, settings: CaptureSettings) -> bool:
        """Keep `sample` for `name` within `settings`' bounds; False (nothing written) when the
        variant, that version or its capture is gone (deleted, capture turned off)."""
        guards = [
            (self.registry.variant_key(name, "capture"), "enabled"),
            (self.registry.variant_key(name, "versions"), str(sample.version)),
        ]
        score = self.store.sample_push(
            self.registry.variant_key(name, TRAFFIC),
            sample.clipped(settings.max_chars).model_dump_json(),
            settings.max_samples,
            settings.retention_s,
            guards,
        )
        return score is not None

    def samples(self, name: str, settings: CaptureSettings | None = None) -> list[TrafficSample]:
        """`name`'s captured requests within retention, oldest first (its settings by default)."""
        settings = settings or self.registry.capture(name)
        raw = self.store.sample_pull(
            self.registry.variant_key(name, TRAFFIC), settings.retention_s, settings.max_samples
        )
        return [TrafficSample.model_validate_json(body) for body in raw]

    def count(self, name: str) -> int:
        return len(self.samples(name))
