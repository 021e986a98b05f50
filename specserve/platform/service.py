"""One base model's serving core, independent of Ray: variants, policy, engine, streamed events.

`ModelService.generate(request)` picks the strategy (policy), makes the variant's adapter resident,
decodes with its n-gram pool, and yields `{"type": "delta", ...}` events then one `"done"` event.
Requests on one replica take turns step by step (one forward at a time, FIFO), so all stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from pydantic import BaseModel, ConfigDict, Field

from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.variants import PoolBook, VariantKey
from specserve.engine.decode import Engine, RequestState
from specserve.engine.lora import BASE_ADAPTER, is_peft_model
from specserve.engine.prompts import encode_messages, encode_prompt
from specserve.engine.proposers import REGISTRY
from specserve.engine.sampling import SamplingParams
from specserve.policies.router import Decision, DrafterView, VariantView, decide
from specserve.policies.settings import PolicySettings

DRAFTER_KINDS = ("medusa", "eagle")


class Target(BaseModel):
    """What the gateway resolved a `model` name to; name None = the base model itself."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    version: int = 0
    adapter_path: str | None = None
    adapter_sha256: str | None = None
    version_times: list[float] = []
    drafters: list[dict] = []  # DrafterView fields
    measured_tau: dict[str, tuple[float, int]] = {}
    forced_strategy: str | None = None
    policy: dict | None = None  # PolicySettings an admin stored; None: the server's own

    @property
    def key(self) -> VariantKey | None:
        return VariantKey(self.name, self.version) if self.name else None

    def view(self) -> VariantView:
        drafters = [DrafterView(**d) for d in self.drafters]
        return VariantView(
            self.name,
            self.version,
            self.version_times,
            drafters,
            self.measured_tau,
            self.forced_strategy,
        )


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: Target
    prompt: str | None = None  # a completion: raw text
    messages: list[dict[str, str]] | None = None  # a chat: through the chat template
    params: SamplingParams
    strategy: str | None = Field(None, description="bypass the policy (tests, benchmarks)")


class ModelService:
    """Serves every variant of one loaded base model."""

    def __init__(
        self,
        loaded,
        adapters: ResidentAdapters,
        pools: PoolBook,
        policy: PolicySettings,
        strategy_configs: dict[str, BaseModel] | None = None,
        pad_width: Callable[[int], int] | None = None,
        clock: Callable[[], float] = time.time,
        curve=None,
    ) -> None:
        """`curve`: the device cost curve (sizes drafter trees); None uses their default trees."""
        self.loaded = loaded
        self.adapters = adapters
        self.pools = pools
        self.policy = policy
        self.strategy_configs = strategy_configs or {}
        self.engine = Engine(adapters.model, loaded.tokenizer, loaded.eos_token_ids, pad_width)
        self.clock = clock
        self.curve = curve
        self.ongoing = 0
        self.cancelled = 0  # requests stopped before they finished
        self._drafters: dict[
            tuple[str, str], tuple[object, dict]
        ] = {}  # (artifact dir, sha) -> drafter, config
        self._weights_sha: str | None = None
        self._turn: asyncio.Lock | None = None

    def stats(self) -> dict:
        """Figures for metrics and health: adapter LRU counters and ongoing requests."""
        adapter_stats = self.adapters.stats
        return {
            "ongoing": self.ongoing,
            "cancelled": self.cancelled,
            "adapters_resident": len(self.adapters.names),
            "adapter_loads": adapter_stats.loads,
            "adapter_evictions": adapter_stats.evictions,
            "adapter_load_seconds_total": round(adapter_stats.load_seconds_total, 4),
        }

    def encode(self, request: GenerateRequest) -> list[int]:
        tok = self.loaded.tokenizer
        if request.messages is not None:
            return encode_messages(tok, request.messages)
        return encode_prompt(tok, request.prompt or "", chat=False)

    def choose(self, request: GenerateRequest) -> tuple[Decision, BaseModel, object]:
        """The policy's decision for this request, the strategy config it implies and the
        variant's drafter (None unless the strategy needs one)."""
        if request.strategy:
            decision = Decision(request.strategy, "strategy set by the caller")
        else:
            policy = self.policy
            if request.target.policy is not None:
                policy = PolicySettings.model_validate(request.target.policy)
            decision = decide(request.target.view(), self.ongoing, policy, self.clock())
        drafter, drafter_cfg = None, None
        if decision.strategy in DRAFTER_KINDS:
            try:
                drafter, drafter_cfg = self.drafter(request.target, decision.strategy)
            except (ValueError, OSError) as err:  # mismatch, missing files: never garbage drafts
                reason = f"{decision.reason}; but its {decision.strategy} drafter was refused ({err}); lookahead"
                decision = Decision("lookahead", reason)
        base = (
            drafter_cfg if drafter_cfg is not None else self.strategy_configs.get(decision.strategy)
        )
        config = REGISTRY.config(decision.strategy, base)
        if decision.max_draft_tokens:
            config = REGISTRY.limited(decision.strategy, config, decision.max_draft_tokens)
        return decision, config, drafter

    def drafter(self, target: Target, kind: str) -> tuple[object, dict | None]:
        """The target's `kind` drafter, loaded once and checked against this base model and the
        variant's adapter (a drafter of another version is refused)."""
        from specserve.engine.drafters.artifact import base_weights_sha256, load_drafter

        found = [d for d in target.drafters if d.get("kind") == kind and d.get("artifact_dir")]
        if not found:
            raise ValueError(f"no {kind} artifact registered for {target.key or 'the base model'}")
        path = found[0]["artifact_dir"]
        cache_key = (path, target.adapter_sha256 or "")
        if cache_key not in self._drafters:
            if self._weights_sha is None:
                self._weights_sha = base_weights_sha256(self.adapters.model)
            drafter = load_drafter(
                path,
                self.adapters.model,
                self.loaded.model_id,
                target.adapter_sha256,
                self._weights_sha,
            )
            config = None
            if self.curve is not None:
                from specserve.engine.drafters.budget import drafter_config

                config = drafter_config(drafter, self.curve)
            self._drafters[cache_key] = (drafter, config)
        return self._drafters[cache_key]

    def ensure_variant(self, target: Target) -> str | None:
        """Make the target's adapter resident; its resident name (`BASE_ADAPTER` for the base once
        the model is peft-wrapped, so base rows never pick up an adapter)."""
        if target.key is None:
            return BASE_ADAPTER if is_peft_model(self.adapters.model) else None
        if not target.adapter_path:
            raise ValueError(f"variant {target.key}: no adapter path")
        name = str(target.key)
        self.adapters.ensure(name, target.adapter_path)
        self.engine.model = self.adapters.model  # the peft wrapper once the first adapter loads
        return name

    async def generate(self, request: GenerateRequest) -> AsyncIterator[dict]:
        """Yield delta events, then a done event; cancelling the consumer stops the decode."""
        if self._turn is None:
            self._turn = asyncio.Lock()
        adapter = self.ensure_variant(request.target)
        decision, config, drafter = self.choose(request)
        ids = self.encode(request)
        pool = self.pools.pool(request.target.key)
        hold = (
            self.adapters.hold(adapter)
            if adapter not in (None, BASE_ADAPTER)
            else contextlib.nullcontext()
        )
        with hold:
            state = self.engine.start(
                ids, request.params, decision.strategy, config, pool, adapter, drafter
            )
            self.ongoing += 1
            try:
                while not state.done:
                    async with self._turn:
                        step = await asyncio.to_thread(self.engine.step, state)
                    if step.text:
                        yield {"type": "delta", "text": step.text, "token_ids": step.new_ids}
                yield self._done(request, state, decision)
            finally:
                self.ongoing -= 1
                if not state.done:  # the consumer went away (client disconnect, cancellation)
                    self.cancelled += 1

    def _done(self, request: GenerateRequest, state: RequestState, decision: Decision) -> dict:
        result = self.engine.result(state)
        return {
            "type": "done",
            "finish_reason": result.finish_reason,
            "usage": {
                "prompt_tokens": len(result.prompt_ids),
                "completion_tokens": len(result.output_ids),
                "total_tokens": len(result.prompt_ids) + len(result.output_ids),
            },
            "specserve": {
                "variant": request.target.name,
                "version": request.target.version or None,
                "strategy": decision.strategy,
                "reason": decision.reason,
                "tau": round(result.tau, 3),
                "forwards": result.forwards,
                "drafted_by_depth": result.drafted_by_depth,
                "accepted_by_depth": result.accepted_by_depth,
                "train_kind": decision.train_kind,
            },
        }
