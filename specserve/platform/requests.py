"""What a generation request says: the resolved target (`Target`, the policy's view of a variant
version plus where its adapter is) and the request itself (`GenerateRequest`: prompt or messages,
sampling, the strategy asked for, n choices), validated as they cross into a model server."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from specserve.adapters.variants import VariantKey
from specserve.engine.proposers import REGISTRY
from specserve.engine.sampling import ChoiceCount, SamplingParams
from specserve.policies.router import VariantView, requestable
from specserve.policies.settings import PolicySettings

SPECULATION_ALIASES = {"off": "ar"}  # a request's `speculation` value -> the strategy it names


def speculation_values(view: VariantView) -> list[str]:
    """What a request's `speculation` may say on this variant now: the aliases ("off"), then
    each strategy it may use (a trained drafter's only once the variant has a usable one)."""
    return [*SPECULATION_ALIASES, *requestable(view, REGISTRY.names())]


class Target(VariantView):
    """What the gateway resolved a `model` name to: the policy's view of the variant version
    (name None = the base model itself), where its adapter is, and the policy settings an admin
    stored (None: the server's own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    adapter_path: str | None = None
    adapter_sha256: str | None = None
    policy: PolicySettings | None = None
    broken: str | None = None  # why this version may not be served (the gateway refuses it)
    capture: bool = False  # the gateway keeps a sample of this variant's traffic (admin's choice)

    @property
    def key(self) -> VariantKey | None:
        return VariantKey(self.name, self.version) if self.name else None


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: Target
    prompt: str | None = None  # a completion: raw text
    messages: list[dict[str, str]] | None = None  # a chat: through the chat template
    params: SamplingParams
    strategy: str | None = Field(None, description="bypass the policy (tests, benchmarks)")
    speculation: str | None = Field(
        None,
        description="the strategy the client asked for, one of `speculation_values(target)` "
        "(`off`: plain ar); None: the policy decides",
    )
    n: ChoiceCount = 1

    @field_validator("speculation")
    @classmethod
    def _allowed(cls, value: str | None, info: ValidationInfo) -> str | None:
        target = info.data.get("target")
        if value is None or target is None:  # no target: its own error is reported
            return value
        valid = speculation_values(target)
        if value in valid:
            return value
        if value in REGISTRY.names():  # only a drafter's strategy waits for its drafter
            why = f"needs a trained {value} drafter, and this model has no usable one now"
        else:
            why = "is unknown"
        message = f"{value[:40]!r} {why}; valid values: {', '.join(valid)}"
        raise PydanticCustomError("invalid_speculation", "{message}", {"message": message})

    @property
    def requested_strategy(self) -> str | None:
        """The strategy `speculation` names (None: not asked)."""
        return SPECULATION_ALIASES.get(self.speculation, self.speculation)

    @property
    def load_aware(self) -> bool:
        """Whether the replica may cut this request's drafts under load: not when the caller set
        `strategy` or an admin forced one the request did not override (a request's own
        `speculation` is cut like the policy's choice)."""
        if self.strategy:
            return False
        return self.speculation is not None or not self.target.forced_strategy

    def choice_params(self, index: int, base_seed: int) -> SamplingParams:
        """Choice `index`'s sampling: seed `base_seed + index`, so choice i answers what a single
        request with that seed answers (choice 0: the request's own seed)."""
        return self.params.model_copy(update={"seed": base_seed + index})
