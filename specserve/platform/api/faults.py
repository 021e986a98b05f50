"""POST /admin/faults (admin token): break one replica of a base model for the fault suite.
Answers 404 unless the platform runs with SPECSERVE_FAULT_INJECTION=1."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from specserve.platform.api.errors import ApiError
from specserve.platform.faults import FaultRequest


def faults_router(gateway, check) -> APIRouter:
    """`check`: the admin API's auth dependency; `gateway.backend.inject_fault` does the work."""
    router = APIRouter(prefix="/admin", dependencies=[Depends(check)])

    @router.post("/faults")
    async def inject(body: FaultRequest):
        if not gateway.settings.fault_injection:
            raise ApiError(404, "fault injection is off", "invalid_request_error", code="not_found")
        if body.model not in gateway.settings.models:
            raise ApiError(
                404,
                f"no base model {body.model!r}; valid: {gateway.settings.models}",
                "invalid_request_error",
                param="model",
                code="model_not_found",
            )
        done = await gateway.backend.inject_fault(body.model, body.kind)
        return {"model": body.model, "kind": body.kind, "done": done}

    return router
