"""A replica's compiled batched forward: off unless set or measured, warmed in the background while
the loop serves eager, its measurement cached for `auto`, and exact output through it."""

from __future__ import annotations

import asyncio
import copy
import time

import pytest
import torch
from word_tokenizer import WordTokenizer

from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.variants import PoolBook
from specserve.engine.decode.engine import Engine
from specserve.engine.forward import compiled_batch
from specserve.engine.sampling import SamplingParams
from specserve.engine.tuning import compile_choice
from specserve.models.load import LoadedModel
from specserve.platform.batch_compile import BatchCompile
from specserve.platform.requests import GenerateRequest, Target
from specserve.platform.service import ModelService
from specserve.policies.settings import PolicySettings

pytestmark = pytest.mark.timeout(600)

IDS = [5, 9, 14, 3, 5, 9, 14, 7, 5, 9]
HIDDEN = 80  # a width no other test compiles (graphs are reused across models of one shape)


@pytest.fixture
def service(tiny_llama, adapter_root):
    base = copy.deepcopy(tiny_llama(1, init_range=0.1, hidden=HIDDEN))
    loaded = LoadedModel(base, WordTokenizer(), "tiny", None, None, frozenset())
    adapters = ResidentAdapters(base, ["tiny-llama"], AdapterLimits(root=adapter_root))
    service = ModelService(loaded, adapters, PoolBook(), PolicySettings(), clock=lambda: 1e6)
    yield service
    service.stop()
    torch.compiler.set_stance("default")


def _text(service, target=None, max_new=20) -> str:
    request = GenerateRequest(
        target=target or Target(),
        prompt=" ".join(f"w{i}" for i in IDS),
        params=SamplingParams(max_new_tokens=max_new),
    )

    async def collect():
        return [event async for event in service.generate(request)]

    events = asyncio.run(collect())
    return "".join(e.text for e in events[:-1])


def test_off_and_unmeasured_auto_stay_eager(service, tmp_path):
    assert BatchCompile().start(service, "off", "tiny", tmp_path).state.status == "off"
    state = BatchCompile().start(service, "auto", "tiny", tmp_path).state
    assert state.status == "off" and "not measured" in state.reason
    assert compiled_batch.runner(service.engine.model, service.scheduler.kv, False) is None


def test_on_warms_beside_the_serving_loop_then_serves_compiled(
    service, tmp_path, tiny_llama, make_adapter, merge_adapter
):
    base = tiny_llama(1, init_range=0.1, hidden=HIDDEN)
    want = Engine(copy.deepcopy(base), WordTokenizer(), frozenset()).generate(
        IDS, SamplingParams(max_new_tokens=20)
    )
    service.start()
    job = BatchCompile().start(service, "on", "tiny", tmp_path)
    assert job.state.status == "warming"
    started = time.perf_counter()
    assert _text(service) == want.text  # served (eager) while the warm-up compiles
    served_in = time.perf_counter() - started
    job.join(timeout=500)
    assert job.state.status == "ready", job.state
    assert served_in < job.state.start_s  # the request did not wait for the compile
    target = compiled_batch._ATTACHED[service.engine.model]
    calls = target.calls
    assert _text(service) == want.text
    path = make_adapter("v", base, seed=7, targets=("q_proj", "v_proj"))
    variant = Target(name="v", version=1, adapter_path=str(path), version_times=[1e6 - 10])
    merged = Engine(merge_adapter(base, path), WordTokenizer(), frozenset())
    assert _text(service, variant) == merged.generate(IDS, SamplingParams(max_new_tokens=20)).text
    assert target.calls - calls >= 10  # both requests' decode steps ran compiled
    model = service.engine.model
    record = compile_choice.cached_record(tmp_path, "tiny", model.device, model.dtype, batched=True)
    assert record is not None and record.graphs == 4
    again = BatchCompile().start(service, "auto", "tiny", tmp_path).state
    assert "batched step" in again.reason  # auto now decides from the cached measurement
