"""The drafter-kind registry: what the engine knows of each trained-drafter kind, declared once
beside the strategy that drafts with it (`proposers.medusa`, `proposers.eagle`).

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

from specserve.engine.cost import CostCurve
from specserve.engine.proposers.base import Registry


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
