"""The `Done` event that ends one choice of a request: finish reason, usage, and what served it
(variant, strategy and why, acceptance by draft depth and source, decode cost)."""

from __future__ import annotations

from specserve.engine.decode.state import GenerationResult, RequestState
from specserve.platform.events import Done, DoneInfo, Usage
from specserve.platform.requests import GenerateRequest
from specserve.policies.router import Decision


def done_event(
    request: GenerateRequest,
    state: RequestState,
    result: GenerationResult,
    decision: Decision,
    costed: tuple[int, float] | None,
    invariant: bool,
) -> Done:
    """`costed`: (decode tokens, their cost in forwards), None without a cost curve (`speed`);
    `invariant`: whether the replica's forward is the position-invariant one."""
    reason = decision.reason
    if state.capped_steps:
        reason += f"; load: drafts cut in {state.capped_steps} of {state.forwards} steps"
    prompt, completion = len(result.prompt_ids), len(result.output_ids)
    return Done(
        finish_reason=result.finish_reason,
        usage=Usage(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        ),
        specserve=DoneInfo(
            variant=request.target.name,
            version=request.target.version or None,
            strategy=decision.strategy,
            reason=reason,
            tau=round(result.tau, 3),
            load_capped_steps=state.capped_steps,
            forwards=result.forwards,
            drafted_by_depth=result.drafted_by_depth,
            accepted_by_depth=result.accepted_by_depth,
            accepted_by_source=result.accepted_by_source,
            train_kind=decision.train_kind,
            retrain_kind=decision.retrain_kind,
            invariant=invariant,
            decode_cost=round(costed[1], 3) if costed else None,
            decode_tokens=costed[0] if costed else 0,
        ),
    )
