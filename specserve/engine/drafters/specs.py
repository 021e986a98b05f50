"""What each drafter kind's artifact holds besides weights (its spec), and the kind names derived
from the specs. Torch-free, so the CLI, policies and platform state name and validate kinds without
loading torch; `drafters.kinds.DRAFTER_KINDS` registers the rest of each of these kinds.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class MedusaSpec(BaseModel):
    """What a Medusa artifact holds (besides weights)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["medusa"] = "medusa"
    heads: int = Field(4, ge=1, description="head k drafts the token k + 2 positions ahead")
    topk: int = Field(8, ge=1, description="candidates per head the static tree may use")
    own_head: int = Field(
        0,
        ge=0,
        description="0: every head shares the frozen LM head; n > 0: each head has its own "
        "trainable LM head over the n-token draft vocabulary (initialized from the frozen one)",
    )


class EagleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["eagle"] = "eagle"
    feature_layers: tuple[int, ...] = Field(
        (-1,),
        description="target layers fused as the draft's input feature: (-1,) is EAGLE-1/2's "
        "final feature; (low, mid, -1) is EAGLE-3's fusion (see hf_internals.hidden_features)",
    )


SPEC_TYPES: tuple[type[BaseModel], ...] = (EagleSpec, MedusaSpec)

# every drafter kind's name (its spec's `kind`), sorted: "eagle", "medusa"
KIND_NAMES: tuple[str, ...] = tuple(sorted(s.model_fields["kind"].default for s in SPEC_TYPES))

# a pydantic field of a drafter kind's name: anything else fails listing the valid names
KindName = Literal[KIND_NAMES]

# a pydantic field of any kind's spec, told apart by its `kind`
DrafterSpec = Annotated[Union[SPEC_TYPES], Field(discriminator="kind")]  # noqa: UP007
