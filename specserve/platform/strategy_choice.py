"""Which strategy a request decodes with: the caller's `strategy`, else the request's own
`speculation`, else the policy's decision; then the strategy config it implies, with the
variant's trained drafter when the strategy drafts with one (refused drafters fall back)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pydantic import BaseModel

from specserve.engine.drafters.kinds import DRAFTER_KINDS
from specserve.engine.proposers import REGISTRY
from specserve.platform.drafter_cache import LoadedDrafter
from specserve.platform.requests import GenerateRequest, Target
from specserve.policies.router import Decision, decide, usable_drafters
from specserve.policies.settings import PolicySettings

DrafterFor = Callable[[Target, str], LoadedDrafter]  # (target, kind) -> the loaded drafter


def choose(
    request: GenerateRequest,
    ongoing: int,
    policy: PolicySettings,
    now: float,
    strategy_configs: dict[str, BaseModel],
    drafter_for: DrafterFor,
) -> tuple[Decision, BaseModel, object]:
    """The decision for this request, the strategy config it implies and the variant's drafter
    (None unless the strategy needs one). `policy`: the server's, unless the target has its own;
    `ongoing`: requests on the replica now."""
    if request.strategy:
        decision = Decision(request.strategy, "strategy set by the caller")
    elif request.requested_strategy is not None:
        reason = f"requested by the request: speculation={request.speculation}"
        decision = Decision(request.requested_strategy, reason)
    else:
        policy = policy if request.target.policy is None else request.target.policy
        decision = decide(request.target, ongoing, policy, now)
    decision, drafter, drafter_cfg = with_drafter(request.target, decision, drafter_for)
    strategy = REGISTRY.get(decision.strategy)
    base = strategy_configs.get(decision.strategy)
    if drafter_cfg is not None:
        tree = strategy.with_drafter_tree
        base = tree(base, drafter_cfg) if tree else drafter_cfg
    config = REGISTRY.config(decision.strategy, base)
    if decision.max_draft_tokens:
        config = REGISTRY.limited(decision.strategy, config, decision.max_draft_tokens)
    return decision, config, drafter


def with_drafter(target: Target, decision: Decision, drafter_for: DrafterFor):
    """(decision, drafter, its device-sized tree config) for a strategy drafting with a
    trained drafter. One that needs it falls back to lookahead when it is refused; one that
    only adds it (hybrid) drafts from n-grams alone without one, and its reason says which."""
    strategy = REGISTRY.get(decision.strategy)
    kind = strategy.drafts_with
    if kind not in DRAFTER_KINDS.names():
        return decision, None, None
    optional = strategy.drafter_optional
    if optional and kind not in {d.kind for d in usable_drafters(target)}:
        reason = f"{decision.reason}; n-grams alone (no usable {kind} drafter)"
        return dataclasses.replace(decision, reason=reason), None, None
    try:
        drafter, drafter_cfg, _ = drafter_for(target, kind)
    except (ValueError, OSError) as err:  # mismatch, missing files: never garbage drafts
        if optional:
            reason = f"{decision.reason}; its {kind} drafter was refused ({err}); n-grams alone"
            return dataclasses.replace(decision, reason=reason), None, None
        reason = f"{decision.reason}; but its {kind} drafter was refused ({err}); lookahead"
        return Decision("lookahead", reason), None, None
    notes = list(drafter.notes or [])
    if optional:
        notes.insert(0, f"{kind} drafter loaded")
    if notes:
        decision = dataclasses.replace(decision, reason="; ".join([decision.reason, *notes]))
    return decision, drafter, drafter_cfg
