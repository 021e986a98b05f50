"""THE GATE for many tenants: random Scheduler schedules over 24 adapters, more than the resident
budget holds, so adapters load and are evicted while others decode; every request equals itself
decoded alone (fp32, greedy and seeded sampling, every strategy)."""

from __future__ import annotations

import copy

import pytest
from schedules import alone, requests, run

from specserve.adapters.errors import AdapterCapacityError
from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.decode.engine import Engine
from specserve.engine.drafters.modules import EagleSpec, MedusaSpec

NAMES = [f"t{i}@1" for i in range(24)]
BUDGET_ADAPTERS = 7  # the byte budget holds this many of them


@pytest.fixture(scope="module")
def setup(tiny_llama, tokenizer, random_drafter, tmp_path_factory):
    from conftest import make_adapter_dir

    base = copy.deepcopy(tiny_llama(1, init_range=0.1))
    root = tmp_path_factory.mktemp("adapters")
    paths = {
        n: make_adapter_dir(root, n.replace("@", "-"), base, seed=i) for i, n in enumerate(NAMES)
    }
    probe = ResidentAdapters(copy.deepcopy(base), ["tiny-llama"], AdapterLimits(root=root))
    one = probe.prepare(NAMES[0], paths[NAMES[0]]).n_bytes
    limits = AdapterLimits(root=root, max_resident_bytes=BUDGET_ADAPTERS * one)
    resident = ResidentAdapters(base, ["tiny-llama"], limits)
    drafters = {
        "medusa": random_drafter(base, MedusaSpec(heads=2, topk=4), seed=2, scale=0.1),
        "eagle": random_drafter(base, EagleSpec(feature_layers=(0, -1)), seed=3, scale=0.1),
    }
    return Engine(base, tokenizer, frozenset(), drafters=drafters), resident, paths


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_schedules_with_loads_and_evictions_equal_each_request_alone(setup, seed):
    engine, resident, paths = setup
    reqs = requests(seed, 30, NAMES)
    deferred = []
    loads_before, evictions_before = resident.stats.loads, resident.stats.evictions

    def admit(req):
        """Load and hold the request's adapter; when the held ones fill the budget, it waits."""
        name = req["adapter"]
        if name not in paths:
            return lambda: None  # a base request
        try:
            resident.ensure(name, paths[name])
        except AdapterCapacityError:
            deferred.append(name)
            return None
        hold = resident.hold(name)
        hold.__enter__()
        return lambda: hold.__exit__(None, None, None)

    scheduler = Scheduler(engine, BatchSettings(max_batch=6, prefill_chunk=16))
    seen = run(engine, scheduler, reqs, admit=admit)
    mid_run_loads = resident.stats.loads - loads_before
    mid_run_evictions = resident.stats.evictions - evictions_before
    checked = 0
    for i, req in enumerate(reqs):
        if req["adapter"] in paths:
            resident.ensure(req["adapter"], paths[req["adapter"]])  # reloaded if evicted
        want = alone(engine, req)
        if seen[i].get("cancelled"):
            assert want[: len(seen[i]["ids"])] == seen[i]["ids"]
        else:
            assert seen[i]["ids"] == want, (i, req["strategy"], req["adapter"])
            checked += 1
    assert checked >= 20
    assert mid_run_loads >= 10 and mid_run_evictions >= 5  # the set really changed mid-run
    assert len(seen[-1]["adapters"]) >= 4  # mixed batches
    assert all(r.holds == 0 for r in resident._resident.values())
    assert len(resident.names) <= BUDGET_ADAPTERS
