"""ServeBackend over a fake deployment handle: a replica lost before the first event is retried
once; lost after it, or twice, the stream raises ReplicaLost; model-server errors pass through."""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import ActorDiedError

from specserve.engine.sampling import SamplingParams
from specserve.platform.events import Delta, Done, DoneInfo, Usage
from specserve.platform.rayserve.backend import ServeBackend
from specserve.platform.service import GenerateRequest, ReplicaLost, Target

DELTA = Delta(text="hi", token_ids=[1])
DONE = Done(
    finish_reason="length",
    usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
    specserve=DoneInfo(
        variant=None,
        version=None,
        strategy="ar",
        reason="test",
        tau=1.0,
        load_capped_steps=0,
        forwards=1,
        drafted_by_depth=[],
        accepted_by_depth=[],
        train_kind=None,
    ),
)
LOST = "lost"  # a script entry: the replica dies here


class FakeHandle:
    """A ModelServer handle whose n-th call streams `scripts[n]` (events, or LOST to die)."""

    def __init__(self, *scripts: list) -> None:
        self.scripts = list(scripts)
        self.calls = 0
        self.generate = self

    def options(self, **options):
        assert options["stream"] is True
        return self

    def remote(self, request: dict):
        script = self.scripts[self.calls]
        self.calls += 1
        return self._stream(script)

    async def _stream(self, script):
        for step in script:
            if step == LOST:
                raise ActorDiedError()
            if isinstance(step, Exception):
                raise step
            yield step.model_dump()


def _collect(handle: FakeHandle) -> list:
    request = GenerateRequest(target=Target(), prompt="w1", params=SamplingParams())

    async def run():
        return [e async for e in ServeBackend({"m": handle}).stream("m", request)]

    return asyncio.run(run())


def test_a_replica_lost_before_the_first_event_is_retried_once():
    handle = FakeHandle([LOST], [DELTA, DONE])
    assert _collect(handle) == [DELTA, DONE] and handle.calls == 2


def test_lost_again_on_the_retry_raises_replica_lost():
    handle = FakeHandle([LOST], [LOST], [DELTA, DONE])
    with pytest.raises(ReplicaLost, match="m: replica lost"):
        _collect(handle)
    assert handle.calls == 2


def test_a_replica_lost_after_the_first_event_is_not_retried():
    handle = FakeHandle([DELTA, LOST], [DELTA, DONE])
    with pytest.raises(ReplicaLost):
        _collect(handle)
    assert handle.calls == 1


def test_a_model_server_error_is_not_a_lost_replica():
    handle = FakeHandle([ValueError("prompt too long")], [DELTA, DONE])
    with pytest.raises(ValueError, match="prompt too long"):
        _collect(handle)
    assert handle.calls == 1
