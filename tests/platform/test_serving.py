"""The composition root: a replica's settings become the target it loads (served name, dtype
workload, adapter limits, cache), the loaded model carries its resident set capped at one count,
the cached curve and tuned configs are read for the forward as it runs, and `build_service` serves
a request with them. A tiny random model saved as a Hugging Face directory; no network."""

from __future__ import annotations

import asyncio

import pytest
import torch

from specserve.adapters.memory import reference_adapter_bytes
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec
from specserve.engine.decode.engine import Engine
from specserve.engine.forward.compiled import forward_key
from specserve.engine.lora.batch import takes_adapters
from specserve.engine.sampling import SamplingParams
from specserve.engine.tuning.cost import CostCurve, cost_curve_path
from specserve.engine.tuning.drafts import Tuned, tuned_path
from specserve.models.load import load_model
from specserve.platform.events import Done
from specserve.platform.requests import GenerateRequest, Target
from specserve.platform.serving import (
    TargetSettings,
    base_spec,
    build_service,
    cached_tuning,
    load_target,
    resident_adapters,
    serving_forward,
)
from specserve.platform.settings import PlatformSettings


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, save_tiny_model_dir):
    return save_tiny_model_dir(tmp_path_factory.mktemp("serving-model"))


@pytest.fixture
def settings(tmp_path, model_dir, adapter_root):
    args = {
        "models": ["tiny"],
        "model_dirs": {"tiny": str(model_dir)},
        "adapter_root": str(adapter_root),
        "dtype": "float32",
        "dtype_rows": 4,
        "max_adapters_per_replica": 3,
        "adapter_memory_fraction": 0.1,
    }
    return PlatformSettings.from_args(args, env={"SPECSERVE_CACHE": str(tmp_path / "cache")})


def test_a_replicas_target_is_its_settings(settings, model_dir, adapter_root, tmp_path):
    target = TargetSettings.for_platform(settings, "tiny")
    assert (target.source, target.name, target.dtype) == (str(model_dir), "tiny", "float32")
    assert target.workload.rows == 4 and target.cache_dir == tmp_path / "cache"
    assert target.adapters == AdapterLimits(
        root=adapter_root, max_resident=3, resident_memory_fraction=0.1
    )
    catalog = TargetSettings.for_platform(settings, "smollm2-135m")  # not in model_dirs
    assert catalog.source == "smollm2-135m"


def test_loaded_under_its_served_name_with_its_resident_set(settings, make_adapter):
    served = load_target(TargetSettings.for_platform(settings, "tiny"))
    assert served.loaded.model_id == "tiny" and served.loaded.dtype == torch.float32
    assert served.adapters.model is served.loaded.model
    assert served.adapters.limits.max_resident == served.adapters.capacity == 3
    path = make_adapter("v1", served.loaded.model, base_name="tiny")
    assert served.adapters.ensure("v1@1", path).sha256  # adapters name the served id


def test_a_target_without_adapter_limits_takes_no_adapters(model_dir, tmp_path):
    target = TargetSettings(source=str(model_dir), dtype="float32", cache_dir=tmp_path)
    served = load_target(target)
    assert served.adapters is None and not takes_adapters(served.loaded.model)
    assert served.loaded.model_id == str(model_dir)  # the loader's name: the resolved path


def test_resident_count_never_exceeds_the_multiplexing_cache(model_dir, make_adapter, adapter_root):
    """Adapters far smaller than the rank-8 reference: bytes would hold all four, but the resident
    set keeps `capacity` (Serve's cache size) and evicts the least recent."""
    loaded = load_model(str(model_dir), dtype="float32")
    loaded.model_id = "tiny"
    spec = BaseModelSpec.of(loaded.model, ["tiny"])
    reference = reference_adapter_bytes(spec, loaded.model, torch.float32)
    limits = AdapterLimits(root=adapter_root, max_resident_bytes=3 * reference)
    adapters = resident_adapters(loaded, limits)
    assert adapters.capacity == adapters.limits.max_resident == 3
    names = [f"small{i}" for i in range(4)]
    for i, name in enumerate(names):
        path = make_adapter(
            name, loaded.model, seed=i, rank=1, targets=("q_proj",), base_name="tiny"
        )
        adapters.ensure(f"{name}@1", path)
    assert adapters.names == [f"{n}@1" for n in names[1:]]
    assert adapters.resident_bytes < reference  # the count evicted, not the bytes


def _write_tuning(cache_dir, model_id: str, dtype: str, config: dict) -> CostCurve:
    curve = CostCurve(model_id=model_id, device="cpu", dtype=dtype, context=200, ms={1: 10.0})
    curve.ms.update({2: 30.0, 4: 20.0})
    path = cost_curve_path(cache_dir, model_id, "cpu", dtype)
    path.parent.mkdir(parents=True)
    path.write_text(curve.model_dump_json())
    tuned = tuned_path(cache_dir, curve, "lookahead")
    tuned.parent.mkdir(parents=True)
    tuned.write_text(
        Tuned(strategy="lookahead", device="cpu", config=config, trials=[]).model_dump_json()
    )
    return curve


def test_cached_tuning_reads_what_tune_left_for_this_forward(settings):
    served = load_target(TargetSettings.for_platform(settings, "tiny"))
    nothing = cached_tuning(served, ["lookahead"])
    assert nothing.curve is None and nothing.configs == {} and nothing.pad_width is None
    curve = _write_tuning(served.cache_dir, "tiny", "torch.float32", {"window": 2})
    tuning = cached_tuning(served, ["lookahead", "prompt_lookup"])
    assert tuning.curve == curve and tuning.configs == {"lookahead": {"window": 2}}
    assert tuning.pad_width(2) == 4  # 4 tokens cost less than 2 on this curve


def test_tuning_is_keyed_by_the_forward_the_engine_serves(settings):
    """The curve and tunings are looked up (and measured by `tune`) for the forward an Engine
    serves, which `serving_forward` switches to before any lookup; the Engine keeps it."""
    served = load_target(TargetSettings.for_platform(settings, "tiny"))
    report = serving_forward(served)
    key = forward_key(served.loaded.model)
    assert key == "torch.float32" + ("+invariant" if report.invariant else "")
    assert serving_forward(served) == report  # idempotent
    engine = Engine.from_loaded(served.loaded)
    assert engine.invariance == report and forward_key(engine.model) == key


def _served_key(settings) -> str:
    served = load_target(TargetSettings.for_platform(settings, "tiny"))
    serving_forward(served)
    return forward_key(served.loaded.model)


def test_build_service_serves_with_the_cached_configs(settings):
    _write_tuning(settings.cache_dir, "tiny", _served_key(settings), {"window": 2, "ngram": 2})
    service = build_service(settings, "tiny")
    try:
        assert service.scheduler.running
        assert service.strategy_configs == {"lookahead": {"window": 2, "ngram": 2}}
        assert service.adapters.capacity == service.adapters.limits.max_resident == 3
        request = GenerateRequest(
            prompt="w3 w4 w5 w3 w4",
            params=SamplingParams(max_new_tokens=4),
            strategy="lookahead",
            target=Target(),
        )

        async def collect():
            return [event async for event in service.generate(request)]

        done = asyncio.run(collect())[-1]
        assert isinstance(done, Done) and done.usage.completion_tokens == 4
    finally:
        service.stop()


def test_base_spec_from_the_config_alone(settings):
    spec = base_spec(settings, "tiny")
    loaded = load_model(str(settings.model_dirs["tiny"]), dtype="float32")
    assert spec.names == frozenset({"tiny"})
    assert spec.linear_shapes == BaseModelSpec.of(loaded.model, ["tiny"]).linear_shapes
