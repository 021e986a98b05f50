"""The gateway's `Backend` under Ray Serve: streams from `ModelServer` deployment handles,
multiplexed by variant@version, turning the event dicts a replica yields back into models. A
replica lost before its first event is retried once (Serve routes around the dead one, or waits
for its replacement, up to `retry_within_s`); lost later, the stream raises `ReplicaLost`.
Light to import (the Serve application builder imports it): the service (torch) loads on first
use."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ray.exceptions import NodeDiedError, RayActorError, WorkerCrashedError
from ray.serve.exceptions import BackPressureError, ReplicaUnavailableError

from specserve.platform.events import Delta, Done, parse_event
from specserve.platform.replica_stats import ReplicaStats

if TYPE_CHECKING:
    from specserve.platform.requests import GenerateRequest

log = logging.getLogger(__name__)
RETRIES_BEFORE_FIRST_EVENT = 1  # a request not started yet is safe to send again


def _replica_lost(err: Exception) -> bool:
    """The replica's process or node went away (not an error the model server raised)."""
    return isinstance(
        err, RayActorError | WorkerCrashedError | NodeDiedError | ReplicaUnavailableError
    )


class ServeBackend:
    """Backend over deployment handles (`servers`: base model -> ModelServer handle). A retry
    must bring its first event within `retry_within_s` (a replacement replica starting), else
    the request fails as ReplicaLost rather than wait on."""

    def __init__(self, servers: dict, retry_within_s: float = 30.0) -> None:
        self.servers = servers
        self.retry_within_s = retry_within_s

    async def stream(
        self, base_model: str, request: GenerateRequest
    ) -> AsyncIterator[Delta | Done]:
        from specserve.platform.service import ReplicaLost  # lazy: imports torch (~5 s)

        for attempt in range(1, RETRIES_BEFORE_FIRST_EVENT + 2):
            events = self._events(base_model, request)
            started = False
            try:
                async with asyncio.timeout(self.retry_within_s if attempt > 1 else None):
                    first = await anext(events)
                started = True
                yield first
                async for event in events:
                    yield event
                return
            except StopAsyncIteration:
                return
            except TimeoutError:
                message = f"{base_model}: no replica answered the retry within "
                raise ReplicaLost(f"{message}{self.retry_within_s:g} s") from None
            except Exception as err:
                if not _replica_lost(err):
                    raise
                if started or attempt > RETRIES_BEFORE_FIRST_EVENT:
                    raise ReplicaLost(f"{base_model}: replica lost: {err}") from err
                log.warning(
                    "%s: replica lost before the first event, retrying: %s", base_model, err
                )
            finally:
                await events.aclose()

    async def _events(
        self, base_model: str, request: GenerateRequest
    ) -> AsyncIterator[Delta | Done]:
        from specserve.platform.backend import Overloaded  # lazy: imports torch (~5 s)

        key = request.target.key
        handle = self.servers[base_model].options(
            stream=True, multiplexed_model_id=str(key) if key else ""
        )
        try:
            async for event in handle.generate.remote(request.model_dump()):
                yield parse_event(event)
        except Exception as err:
            # Serve's queue (BackPressureError) or the replica's engine queue (Overloaded, which
            # reaches us wrapped in a RayTaskError whose `cause` it is)
            if isinstance(err, BackPressureError | Overloaded) or isinstance(
                getattr(err, "cause", None), Overloaded
            ):
                raise Overloaded(f"{base_model}: {err}") from None
            raise

    async def inject_fault(self, base_model: str, kind: str) -> str:
        """On one replica Serve picks (the fault suite; ModelServer refuses unless enabled)."""
        return await self.servers[base_model].inject_fault.remote(kind)

    async def replica_stats(self) -> dict[str, ReplicaStats]:
        out = {}
        for model, handle in self.servers.items():
            try:
                out[f"{model}/any"] = await handle.stats.remote()
            except Exception as err:  # noqa: BLE001 - stats are best effort, any replica failure
                log.warning("stats of %s: %s", model, err)
        return out
