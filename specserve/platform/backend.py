"""How the gateway reaches model servers: `Backend.stream(base_model, request)` yields the events
of ModelService.generate as `Delta` / `Done` models. `LocalBackend` calls services in this
process; the Ray Serve backend (rayserve/deployments.py) calls deployment handles, multiplexed by
variant@version, and turns the dicts they stream back into events with `parse_event`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from specserve.platform.events import Delta, Done
from specserve.platform.faults import inject
from specserve.platform.replica_stats import ReplicaStats
from specserve.platform.requests import GenerateRequest
from specserve.platform.service import ModelService, Overloaded

__all__ = ["Backend", "LocalBackend", "Overloaded"]


class Backend(Protocol):
    def stream(self, base_model: str, request: GenerateRequest) -> AsyncIterator[Delta | Done]: ...

    async def replica_stats(self) -> dict[str, ReplicaStats]: ...

    async def inject_fault(self, base_model: str, kind: str) -> str: ...


class LocalBackend:
    """Model services living in this process (tests, `specserve up --local`)."""

    def __init__(self, services: dict[str, ModelService]) -> None:
        self.services = services

    def stream(self, base_model: str, request: GenerateRequest) -> AsyncIterator[Delta | Done]:
        return self.services[base_model].generate(request)

    async def replica_stats(self) -> dict[str, ReplicaStats]:
        return {f"{name}/local": service.stats() for name, service in self.services.items()}

    async def inject_fault(self, base_model: str, kind: str) -> str:
        return inject(self.services[base_model], kind)
