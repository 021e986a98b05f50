"""The composition root of a model server: settings in, ready parts out, for the Serve replica, the
drafter job and the command line alike. `load_target` loads one base model with its resident
adapters; `cached_tuning` reads the cost curve and tuned configs an earlier `tune` left;
`build_service` makes them a started `ModelService`; `base_spec` gives module shapes from a config.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import transformers
from pydantic import BaseModel, ConfigDict, Field

from specserve.adapters.resident import ResidentAdapters, base_model_names
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec
from specserve.adapters.variants import PoolBook
from specserve.engine.forward import invariance
from specserve.engine.forward.compiled import forward_key
from specserve.engine.forward.head import install_head
from specserve.engine.forward.invariance import InvarianceReport
from specserve.engine.tuning.cost import CostCurve
from specserve.engine.tuning.drafts import cached_choices
from specserve.engine.tuning.dtype_choice import Workload
from specserve.models.load import LoadedModel, load_model
from specserve.models.provision import pull_model
from specserve.paths import default_cache_dir
from specserve.platform.service import ModelService
from specserve.policies.settings import PolicySettings

if TYPE_CHECKING:  # the command line (and the GPU check) loads models without the platform's
    from specserve.platform.settings import PlatformSettings  # environment parsing

logger = logging.getLogger(__name__)
SERVED_STRATEGIES = ("lookahead", "prompt_lookup")  # the tuned configs a replica starts with


class TargetSettings(BaseModel):
    """What loading one base model to serve takes: a replica's (`for_platform`) or a command's
    flags. Example: TargetSettings(source="smollm2-135m", dtype="float32")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="catalog name, HF model dir or .gguf file")
    name: str | None = Field(
        None, description="the name it is served under; None: the loader's (catalog name or path)"
    )
    device: str | None = Field(None, description="cpu, cuda, cuda:1; None: cuda if present")
    dtype: str = Field("auto", description="auto (cheapest measured here) / float32 / bfloat16")
    workload: Workload = Field(Workload(), description="the request `dtype: auto` prices")
    float32_logits: bool = Field(False, description="the LM head in float32 over bf16 states")
    cache_dir: Path = Field(default_factory=default_cache_dir)
    adapters: AdapterLimits | None = Field(
        None, description="limits of its resident adapters; None: the model takes no adapters"
    )

    @classmethod
    def for_platform(cls, settings: PlatformSettings, model_id: str) -> TargetSettings:
        """`model_id` as the platform serves it (its local dir if `model_dirs` names one)."""
        limits = AdapterLimits(
            root=settings.resolved_adapter_root(),
            max_resident=settings.max_adapters_per_replica,
            resident_memory_fraction=settings.adapter_memory_fraction,
        )
        return cls(
            source=str(settings.model_dirs.get(model_id, model_id)),
            name=model_id,
            device=settings.device,
            dtype=settings.dtype,
            workload=settings.dtype_workload(),
            cache_dir=settings.resolved_cache_dir(),
            adapters=limits,
        )


@dataclass(frozen=True)
class ServedModel:
    """A base model loaded to serve: weights, tokenizer and dtype (with why), its resident
    adapters (None when it takes none), and the cache its measurements live in."""

    loaded: LoadedModel
    adapters: ResidentAdapters | None
    cache_dir: Path


@dataclass(frozen=True)
class Tuning:
    """What an earlier `tune`/`bench` left for this model, device and forward: the cost curve
    (None: never measured) and strategy -> tuned config."""

    curve: CostCurve | None
    configs: dict[str, dict]

    @property
    def pad_width(self) -> Callable[[int], int] | None:
        """Verify widths padded to the device's cheapest (None: unpadded)."""
        return self.curve.padded_width if self.curve is not None else None


def load_target(target: TargetSettings, log: Callable[[str], object] = logger.info) -> ServedModel:
    """Load the model (dtype `auto` measured and cached), named as served, and its resident set."""
    loaded = load_model(
        target.source,
        device=target.device,
        dtype=target.dtype,
        cache_dir=target.cache_dir,
        workload=target.workload,
    )
    if target.name is not None:
        loaded.model_id = target.name  # the served name, whatever directory it came from
    if loaded.dtype_choice is not None:
        log(f"dtype {loaded.dtype_choice.chosen} (auto: {loaded.dtype_choice.reason})")
    head = install_head(loaded.model, float32=target.float32_logits)
    if head is not None:
        log(f"logits: {head}")
    adapters = None
    if target.adapters is not None:
        adapters = resident_adapters(loaded, target.adapters, log)
    return ServedModel(loaded, adapters, target.cache_dir)


def resident_adapters(
    loaded: LoadedModel, limits: AdapterLimits, log: Callable[[str], object] = logger.info
) -> ResidentAdapters:
    """The model's resident adapters, never more of them than `capacity` (what the byte budget
    holds of rank-8 adapters): the one count Serve's multiplexing cache is sized by too."""
    adapters = ResidentAdapters(loaded.model, base_model_names(loaded.model_id), limits)
    adapters.bound_count_by_capacity()  # the budget is measured once (free memory now)
    log(
        f"{loaded.model_id}: adapter budget {adapters.budget_bytes >> 20} MiB, "
        f"{adapters.capacity} adapters resident at most (the rank-8 ones it holds, or the cap)"
    )
    return adapters


def serving_forward(served: ServedModel) -> InvarianceReport:
    """Switch the model to the forward an `Engine` serves it with (the position-invariant one
    where this machine's kernels allow, `invariance.apply`; idempotent), so the cost curve and
    tunings are measured and looked up for that forward, not the plain one."""
    return invariance.apply(served.loaded.model)


def cached_tuning(served: ServedModel, strategies: Iterable[str]) -> Tuning:
    """The cached cost curve and tuned configs of the model's forward as it runs now (compiled
    or not); nothing is measured (a server starts fast and uses defaults until tuned)."""
    loaded = served.loaded
    curve, configs = cached_choices(
        served.cache_dir,
        loaded.model_id,
        loaded.device,
        forward_key(loaded.model),
        list(strategies),
    )
    return Tuning(curve, configs)


def build_service(settings: PlatformSettings, model_id: str) -> ModelService:
    """A started ModelService of `model_id` as a replica serves it: the model, its resident
    adapters, the cached curve and configs, a fresh n-gram pool book and the policy file's
    settings."""
    served = load_target(TargetSettings.for_platform(settings, model_id))
    loaded = served.loaded
    why = f" (auto: {loaded.dtype_choice.reason})" if loaded.dtype_choice is not None else ""
    logger.info("model %s in %s%s", model_id, loaded.dtype, why)
    serving_forward(served)
    tuning = cached_tuning(served, SERVED_STRATEGIES)
    policy = PolicySettings.from_yaml(settings.resolved_policy_file())
    return ModelService(
        loaded,
        served.adapters,
        PoolBook(journal_size=4096),
        policy,
        tuning.configs,
        tuning.pad_width,
        curve=tuning.curve,
        batch=settings.batch,
    ).start()


def base_spec(settings: PlatformSettings, model_id: str) -> BaseModelSpec:
    """Module shapes of a served base model from its config alone (meta device: no weights)."""
    model_dir = settings.model_dirs.get(model_id) or pull_model(
        model_id, settings.resolved_cache_dir()
    )
    config = transformers.AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return BaseModelSpec.of(model, base_model_names(model_id))
