"""The gateway's `Backend` under Ray Serve: streams from `ModelServer` deployment handles,
multiplexed by variant@version, turning the event dicts a replica yields back into models.
Light to import (the Serve application builder imports it): the service loads on first use."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from specserve.platform.events import Delta, Done, parse_event

if TYPE_CHECKING:
    from specserve.platform.service import GenerateRequest

log = logging.getLogger(__name__)


class ServeBackend:
    """Backend over deployment handles (`servers`: base model -> ModelServer handle)."""

    def __init__(self, servers: dict) -> None:
        self.servers = servers

    async def stream(
        self, base_model: str, request: GenerateRequest
    ) -> AsyncIterator[Delta | Done]:
        from ray.serve.exceptions import BackPressureError

        from specserve.platform.backend import Overloaded

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

    async def replica_stats(self) -> dict[str, dict]:
        out = {}
        for model, handle in self.servers.items():
            try:
                out[f"{model}/any"] = await handle.stats.remote()
            except Exception as err:  # noqa: BLE001 - stats are best effort, any replica failure
                log.warning("stats of %s: %s", model, err)
        return out
