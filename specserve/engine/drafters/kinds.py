"""The drafter-kind registry: what the engine knows of each trained-drafter kind (Medusa heads,
the EAGLE layer: module, draft-level cost, tree budget); the strategy of a kind's name
(`proposers.medusa`, `proposers.eagle`) drafts with its artifacts.

The names and specs live torch-free in `drafters.specs` (the CLI, policies and platform state read
them there; a test pins that they agree with this registry). Training cannot be imported from the
engine, so `training.kinds.TRAINERS` adds each kind's trainer, keyed by these names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn

from specserve.engine.drafters.modules import EagleDraft, MedusaHeads, additive_mask
from specserve.engine.drafters.specs import EagleSpec, MedusaSpec
from specserve.engine.drafters.trees import choose_tree_size, greedy_tree
from specserve.engine.forward.head import column_head, head_product
from specserve.engine.registry import Registry
from specserve.engine.tuning.cost import CostCurve


@dataclass(frozen=True)
class DrafterKind:
    """One drafter kind; its name is its spec's `kind`, and the strategy of that name drafts
    with its artifacts (`Engine` hands a strategy the drafter of its name)."""

    spec_type: type[BaseModel]  # what its artifact holds besides weights (`drafters.specs`)
    # (target, spec) -> the untrained module (`artifact.build_module` casts it to the target)
    build_module: Callable[[Any, BaseModel], nn.Module]
    # (drafter, head rows [v, H], nodes) -> one draft level's forward, timed by the tree budget
    draft_level: Callable[[Any, torch.Tensor, int], torch.Tensor]
    # (acc[d][r], target cost curve, draft level cost, max nodes) -> the strategy config of the
    # tree maximizing expected τ / step cost, with its "predicted_speedup"
    tree_config: Callable[[list[list[float]], CostCurve, float, int], dict]
    # whether a step runs one draft level per tree depth (EAGLE) or one for the whole tree (Medusa)
    level_per_depth: bool = True

    def draft_levels(self, drafted_by_depth: list[int]) -> int:
        """Draft levels a request ran, from its steps drafting at least each depth. Example:
        [5, 3, 1] (5 drafting steps, 3 reaching depth 2, 1 depth 3): 9 per depth, 5 per step."""
        if self.level_per_depth:
            return sum(drafted_by_depth)
        return drafted_by_depth[0] if drafted_by_depth else 0

    @property
    def name(self) -> str:
        return self.spec_type.model_fields["kind"].default


DRAFTER_KINDS: Registry[DrafterKind] = Registry("drafter kind", "drafter kinds")


def _medusa_heads(target, spec: MedusaSpec) -> MedusaHeads:
    return MedusaHeads(target.config.hidden_size, spec)


def _medusa_level(drafter, rows: torch.Tensor, nodes: int) -> torch.Tensor:
    """All heads and the LM head for one feature (the heads draft every depth at once)."""
    feature = torch.zeros(drafter.target.config.hidden_size, device=rows.device, dtype=rows.dtype)
    return drafter.module.logits(feature, rows, column_head(drafter.target))


def _medusa_tree(acc: list[list[float]], curve: CostCurve, step_cost: float, max_size: int) -> dict:
    """The static tree's size; the heads cost `step_cost` once per step, whatever the tree."""
    size, speed = choose_tree_size(acc, curve.relative, max_size, draft_fixed_cost=step_cost)
    return {"tree_size": max(size, 1), "predicted_speedup": round(speed, 3)}


MEDUSA_KIND = DRAFTER_KINDS.register(
    DrafterKind(MedusaSpec, _medusa_heads, _medusa_level, _medusa_tree, level_per_depth=False)
)


def _eagle_level(drafter, rows: torch.Tensor, nodes: int) -> torch.Tensor:
    """The draft layer over `nodes` rows and the draft LM head's log-probabilities."""
    target = drafter.target
    dev, dtype = rows.device, rows.dtype
    e = torch.zeros(1, nodes, target.config.hidden_size, device=dev, dtype=dtype)
    mask = additive_mask(torch.ones(nodes, nodes, dtype=torch.bool, device=dev), dtype)[None, None]
    pos = torch.zeros(1, nodes, dtype=torch.long, device=dev)
    h = drafter.module(e, e, mask, pos, target, None)
    logits = head_product(h[0], rows, column_head(target))  # [nodes, v], as the proposer's
    return torch.log_softmax(logits.float(), dim=-1)


def _eagle_tree(acc: list[list[float]], curve: CostCurve, step_cost: float, max_size: int) -> dict:
    """The dynamic tree's depth, expansion and size; each level costs `step_cost`."""
    size, speed = choose_tree_size(acc, curve.relative, max_size, draft_step_cost=step_cost)
    size = max(size, 1)
    paths = [p for p, _ in greedy_tree(acc, size)]
    depth = max(len(p) for p in paths)
    topk = min(max(2, 1 + max(r for p in paths for r in p)), 8)
    return {
        "depth": depth,
        "topk": topk,
        "total_tokens": size,
        "predicted_speedup": round(speed, 3),
    }


EAGLE_KIND = DRAFTER_KINDS.register(DrafterKind(EagleSpec, EagleDraft, _eagle_level, _eagle_tree))
