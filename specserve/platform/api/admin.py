"""The admin API (/admin, bearer token): register/list/show/delete variants, force a strategy,
read/change policy settings, start/follow/cancel drafter training, traffic capture and retrains
from traffic (admin_traffic.py). 401 without a token, 403 wrong;
a variant may not take a served model's name; a version serves a frozen copy of the validated
adapter (adapters/content.py), never its source; the list is paged (`limit`, `after`; `has_more`,
`first_id`, `last_id`). A store outage answers 503 registry_unavailable (middleware.py's handler).
"""

from __future__ import annotations

import hmac
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from specserve.adapters.content import freeze_adapter
from specserve.adapters.errors import AdapterDigestError, AdapterError
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec, validate_adapter
from specserve.adapters.variants import VariantKey
from specserve.engine.proposers import REGISTRY
from specserve.platform.api.admin_traffic import TrafficAdmin, add_traffic_routes
from specserve.platform.api.errors import RETRY_LATER, ApiError
from specserve.platform.rayserve.retrain import RetrainAsk
from specserve.platform.state.records import DrafterStatus, VariantSpec, VariantState
from specserve.platform.state.registry import MAX_PAGE, Registry, UnknownVariant
from specserve.policies.router import decide
from specserve.policies.settings import PolicySettings


class RegisterBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    base_model: str
    adapter_path: str = Field(description="adapter directory, under the server's adapter root")
    hints: dict[str, str | int | float | bool] = {}


class StrategyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    strategy: str | None


class TrainBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: str = "eagle"
    budget_minutes: float | None = Field(None, gt=0)
    from_traffic: bool = Field(
        False,
        description="retrain from the variant's captured traffic: a new revision that replaces "
        "the current drafter only if its held-out tau on recent traffic beats it",
    )
    min_gain: float = Field(0.0, ge=0, description="with from_traffic: tau the new one must gain")


DEFAULT_PAGE = 100


class Admin:
    """Admin operations over the registry; `jobs` runs drafter training (None: not available)."""

    def __init__(
        self,
        registry: Registry,
        token: str | None,
        base_specs: dict[str, BaseModelSpec],
        limits: AdapterLimits,
        default_policy: PolicySettings,
        jobs=None,
    ) -> None:
        self.registry, self.token, self.base_specs = registry, token, base_specs
        self.limits, self.default_policy, self.jobs = limits, default_policy, jobs
        self.traffic = TrafficAdmin(self)

    def check(self, request: Request) -> None:
        auth = request.headers.get("authorization", "")
        if not auth.lower().startswith("bearer ") or not auth[7:].strip():
            raise ApiError(
                401,
                "admin API needs 'Authorization: Bearer <token>'",
                "authentication_error",
                code="missing_token",
            )
        if not self.token or not hmac.compare_digest(auth[7:].strip(), self.token):
            raise ApiError(
                403, "admin token is not valid", "permission_error", code="invalid_token"
            )

    def policy(self) -> PolicySettings:
        stored = self.registry.policy_settings()
        return self.default_policy if stored is None else stored

    def register(self, body: RegisterBody) -> dict:
        self._check_name(body.name)
        spec = self.base_specs.get(body.base_model)
        if spec is None:
            raise ApiError(
                400,
                f"unknown base model {body.base_model!r}; served: {sorted(self.base_specs)}",
                param="base_model",
                code="unknown_base_model",
            )
        try:
            checked = validate_adapter(Path(body.adapter_path), spec, self.limits)
            frozen = freeze_adapter(checked.path, self.limits.root)
            if frozen.sha256 != checked.sha256:
                raise AdapterDigestError("the adapter's files changed while it was registered")
        except AdapterError as err:
            raise ApiError(400, str(err), param="adapter_path", code=err.code) from None
        record = self.registry.register(
            VariantSpec(
                name=body.name,
                base_model=body.base_model,
                adapter_path=str(frozen.path),
                adapter_sha256=frozen.sha256,
                hints=body.hints,
            )
        )
        return record.model_dump() | {
            "rank": checked.rank,
            "target_modules": list(checked.target_modules),
        }

    def _check_name(self, name: str) -> None:
        """400 naming `name` unless it is a valid variant name that no served model id (or a
        name a base model answers to) takes, whatever the case: an id means one model."""
        taken = {n.casefold(): n for m, spec in self.base_specs.items() for n in (m, *spec.names)}
        if name.casefold() in taken:
            raise ApiError(
                400,
                f"name {name!r} is taken by the base model {taken[name.casefold()]!r}; a variant"
                f" may not be named like a served model (served: {sorted(self.base_specs)})",
                param="name",
                code="reserved_name",
            )
        try:
            VariantKey(name, 1)
        except ValueError as err:
            raise ApiError(400, str(err), param="name", code="invalid_name") from None

    def show(self, name: str) -> dict:
        return _describe(self.variant(name), self.policy())

    def list_page(self, limit: int = DEFAULT_PAGE, after: str | None = None) -> dict:
        """One page of `show`s in name order, OpenAI-list style; a fixed number of store reads
        per page (not per variant)."""
        page = self.registry.page(limit, after)
        policy = self.policy()
        shown = [_describe(state, policy) for state in page.variants]
        return {
            "object": "list",
            "variants": shown,
            "has_more": page.has_more,
            "first_id": shown[0]["name"] if shown else None,
            "last_id": shown[-1]["name"] if shown else None,
        }

    def variant(self, name: str) -> VariantState:
        """The variant `name` (its current version); 404 if there is none."""
        try:
            return self.registry.variant(name)
        except (UnknownVariant, ValueError):
            raise ApiError(
                404, f"unknown variant {name!r}", param="name", code="variant_not_found"
            ) from None

    def set_strategy(self, name: str, body: StrategyBody) -> dict:
        self.variant(name)
        if body.strategy is not None:
            try:
                REGISTRY.get(body.strategy)
            except ValueError as err:
                raise ApiError(400, str(err), param="strategy", code="unknown_strategy") from None
        self.registry.set_override(name, body.strategy)
        return self.show(name)

    def set_policy(self, body: dict[str, Any]) -> dict:
        try:
            settings = PolicySettings.model_validate(self.policy().model_dump() | body)
        except ValueError as err:
            raise ApiError(400, str(err), code="invalid_policy") from None
        self.registry.set_policy_settings(settings)
        return settings.model_dump()

    def train(self, name: str, body: TrainBody) -> dict:
        current = self.variant(name).current
        if self.jobs is None:
            raise ApiError(
                503,
                "drafter training is not available on this deployment",
                "server_error",
                code="no_trainer",
            )
        if body.kind not in self.policy().drafter_kinds:
            raise ApiError(
                400,
                f"kind {body.kind!r}; valid: {self.policy().drafter_kinds}",
                param="kind",
                code="unknown_kind",
            )
        if body.from_traffic:
            ask = RetrainAsk(min_gain=body.min_gain)
            status = self.traffic.retrain(name, body.kind, body.budget_minutes, ask)
            return status.model_dump()
        status = self.registry.drafter(current.key, body.kind)
        if status is not None and status.state in ("queued", "running"):
            raise ApiError(
                409,
                f"{body.kind} training for {current.key} is already {status.state}",
                code="already_running",
            )
        self.registry.set_drafter(current.key, DrafterStatus(kind=body.kind, state="queued"))
        self.jobs.start(current, body.kind, body.budget_minutes)
        return self.registry.drafter(current.key, body.kind).model_dump()

    def auto_train(self, name: str, version: int, kind: str) -> bool:
        """The policy asked for a drafter: queue it once per version and kind (never while one is
        queued, running, done or failed for that version). True if training was queued."""
        if self.jobs is None or not self.policy().auto_train:
            return False
        try:
            record = self.registry.get(name, version)
        except (UnknownVariant, ValueError):
            return False
        if self.registry.drafter(record.key, kind) is not None:
            return False
        self.registry.set_drafter(record.key, DrafterStatus(kind=kind, state="queued"))
        self.jobs.start(record, kind, None)
        return True

    def auto_retrain(self, name: str, version: int, kind: str) -> bool:
        """The policy asks to retrain `kind` from traffic (admin_traffic.TrafficAdmin)."""
        return self.traffic.auto_retrain(name, version, kind)

    def cancel(self, name: str, kind: str) -> dict:
        current = self.variant(name).current
        status = self.registry.drafter(current.key, kind)
        if status is None or status.state not in ("queued", "running"):
            raise ApiError(409, f"no {kind} training running for {current.key}", code="not_running")
        if self.jobs is not None:
            self.jobs.cancel(current.key, kind)
        self.registry.set_drafter(current.key, status.model_copy(update={"state": "cancelled"}))
        return self.registry.drafter(current.key, kind).model_dump()


def admin_router(admin: Admin) -> APIRouter:
    router = APIRouter(prefix="/admin", dependencies=[Depends(admin.check)], responses=RETRY_LATER)

    @router.post("/variants", status_code=201)
    def register(body: RegisterBody):
        return admin.register(body)

    @router.get("/variants")
    def list_variants(
        limit: int = Query(DEFAULT_PAGE, ge=1, le=MAX_PAGE, description="variants per page"),
        after: str | None = Query(None, description="the last name of the previous page"),
    ):
        return JSONResponse(admin.list_page(limit, after))  # plain data: no jsonable_encoder

    @router.get("/variants/{name}")
    def show(name: str):
        return admin.show(name)

    @router.delete("/variants/{name}")
    def delete(name: str):
        admin.variant(name)
        admin.registry.delete(name)
        return {"deleted": name}

    @router.put("/variants/{name}/strategy")
    def set_strategy(name: str, body: StrategyBody):
        return admin.set_strategy(name, body)

    @router.post("/variants/{name}/drafters", status_code=202)
    def train(name: str, body: TrainBody):
        return admin.train(name, body)

    @router.get("/variants/{name}/drafters")
    def drafters(name: str):
        return {k: d.model_dump() for k, d in admin.variant(name).drafters.items()}

    @router.delete("/variants/{name}/drafters/{kind}")
    def cancel(name: str, kind: str):
        return admin.cancel(name, kind)

    add_traffic_routes(router, admin.traffic)

    @router.get("/policy")
    def get_policy():
        return admin.policy().model_dump()

    @router.put("/policy")
    def put_policy(body: dict[str, Any]):
        return admin.set_policy(body)

    return router


def _describe(state: VariantState, policy: PolicySettings) -> dict:
    """What `show` answers for one variant: versions, override, the policy's decision now."""
    decision = decide(state.policy_view(), 0, policy, time.time())
    return {
        "name": state.name,
        "versions": [
            v.model_dump() | {"broken": state.broken.get(v.version)} for v in state.versions
        ],
        "current_version": state.version,
        "override": state.override,
        "capture": state.capture.model_dump(),
        "strategy": decision.strategy,
        "reason": decision.reason,
        "drafters": {k: d.model_dump() for k, d in state.drafters.items()},
        "acceptance": {
            s: a.model_dump() | {"tau": a.tau, "acceptance_rate": a.acceptance_rate}
            for s, a in state.acceptance.items()
        },
    }
