"""The admin API's traffic capture and retrains from traffic: read or set a variant's capture
(`GET`/`PUT /admin/variants/{name}/capture`), erase its captured requests now (`DELETE
/admin/variants/{name}/traffic`), and start a retrain of a drafter from them (`retrain`, behind
`POST /admin/variants/{name}/drafters` with `from_traffic`, and the policy's `auto_retrain`).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from fastapi import APIRouter

from specserve.platform.api.errors import ApiError
from specserve.platform.rayserve.retrain import RetrainAsk, next_revision
from specserve.platform.state.records import (
    CaptureSettings,
    DrafterStatus,
    RetrainRecord,
    VariantState,
)
from specserve.platform.state.registry import TRAFFIC, Registry
from specserve.platform.state.traffic import TrafficLog
from specserve.policies.settings import PolicySettings

MIN_SAMPLES = 2  # an admin's retrain: one request to train on, one held out


class AdminView(Protocol):
    """What the traffic admin uses of the admin (admin.py's `Admin`)."""

    registry: Registry
    jobs: Any  # rayserve.jobs' RayJobs or ThreadJobs; None: no training here

    def policy(self) -> PolicySettings: ...

    def variant(self, name: str) -> VariantState: ...


class TrafficAdmin:
    """Capture settings and retrains over the admin's registry and jobs."""

    def __init__(self, admin: AdminView) -> None:
        self.admin, self.registry = admin, admin.registry
        self.log = TrafficLog(admin.registry)

    def show(self, name: str) -> dict:
        state = self.admin.variant(name)
        return state.capture.model_dump() | {"samples": self.log.count(name)}

    def set(self, name: str, body: dict[str, Any]) -> dict:
        """Change the fields given (the rest as they are)."""
        current = self.admin.variant(name).capture
        try:
            settings = CaptureSettings.model_validate(current.model_dump() | body)
        except ValueError as err:
            raise ApiError(400, str(err), code="invalid_capture") from None
        self.registry.set_capture(name, settings)
        return self.show(name)

    def erase(self, name: str) -> dict:
        self.admin.variant(name)
        erased = self.log.count(name)
        self.registry.store.delete(self.registry.variant_key(name, TRAFFIC))
        return {"erased": erased}

    def retrain(
        self, name: str, kind: str, budget_minutes: float | None, ask: RetrainAsk
    ) -> DrafterStatus:
        """Queue a retrain of `name`'s current `kind` drafter from its traffic (409 while one
        runs for it, or when fewer than MIN_SAMPLES requests are captured)."""
        current = self.admin.variant(name).current
        status = self.registry.drafter(current.key, kind)
        busy = status is not None and (
            status.state in ("queued", "running")
            or (status.retrain is not None and status.retrain.state in ("queued", "running"))
        )
        if busy:
            raise ApiError(
                409, f"{kind} training for {current.key} is running", code="already_running"
            )
        count = self.log.count(name)
        if count < MIN_SAMPLES:
            raise ApiError(
                409,
                f"{name} has {count} captured requests (a retrain needs {MIN_SAMPLES}); turn "
                f"capture on (PUT /admin/variants/{name}/capture) and serve traffic",
                code="no_traffic",
            )
        base = status or DrafterStatus(kind=kind, state="queued")
        queued = RetrainRecord(
            revision=next_revision(base), state="queued", trigger=ask.trigger,
            started_at=ask.started_at,
        )  # fmt: skip
        status = self.registry.set_drafter(current.key, base.with_retrain(queued))
        self.admin.jobs.start(current, kind, budget_minutes, ask)
        return status

    def auto_retrain(self, name: str, version: int, kind: str) -> bool:
        """The policy saw `kind`'s acceptance drop on name@version: retrain from traffic if the
        variant captures it, has `retrain_min_samples`, and had no retrain within the cooldown.
        True if a retrain was queued."""
        policy = self.admin.policy()
        if self.admin.jobs is None or not policy.retrain_on_drop:
            return False
        state = self.admin.variant(name)
        if state.version != version or not state.capture.enabled:
            return False
        status = self.registry.drafter(state.current.key, kind)
        last = status.retrain if status is not None else None
        if last is not None and time.time() - last.started_at < policy.retrain_cooldown_s:
            return False
        if self.log.count(name) < policy.retrain_min_samples:
            return False
        try:
            self.retrain(name, kind, None, RetrainAsk(trigger="policy"))
        except ApiError:
            return False  # one already running, or the traffic went below the minimum
        return True


def add_traffic_routes(router: APIRouter, traffic: TrafficAdmin) -> None:
    """The capture routes, on the admin router (its prefix and token check apply)."""

    @router.get("/variants/{name}/capture")
    def show_capture(name: str):
        return traffic.show(name)

    @router.put("/variants/{name}/capture")
    def set_capture(name: str, body: dict[str, Any]):
        return traffic.set(name, body)

    @router.delete("/variants/{name}/traffic")
    def erase_traffic(name: str):
        return traffic.erase(name)
