"""ServeBackend over a fake deployment handle: a replica lost before the first event is retried
once; lost after it, or twice, the stream raises ReplicaLost; model-server errors pass through."""

from __future__ import annotations

import asyncio

import pytest
from done_event import done_event
from ray.exceptions import ActorDiedError

from specserve.engine.sampling import SamplingParams
from specserve.platform.events import Delta
from specserve.platform.rayserve.backend import ServeBackend
from specserve.platform.requests import GenerateRequest, Target
from specserve.platform.service import ReplicaLost

DELTA = Delta(text="hi", token_ids=[1])
DONE = done_event()
LOST = "lost"  # a script entry: the replica dies here
NEVER = "never"  # a script entry: no replica takes the call (the replacement is not up)


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
            if step == NEVER:
                await asyncio.Event().wait()
            if step == LOST:
                raise ActorDiedError()
            if isinstance(step, Exception):
                raise step
            yield step.model_dump()


def _collect(handle: FakeHandle, retry_within_s: float = 30.0) -> list:
    request = GenerateRequest(target=Target(), prompt="w1", params=SamplingParams())

    async def run():
        backend = ServeBackend({"m": handle}, retry_within_s)
        return [e async for e in backend.stream("m", request)]

    return asyncio.run(run())


def test_a_replica_lost_before_the_first_event_is_retried_once():
    handle = FakeHandle([LOST], [DELTA, DONE])
    assert _collect(handle) == [DELTA, DONE] and handle.calls == 2


def test_a_retry_that_does_not_start_within_its_deadline_raises_replica_lost():
    handle = FakeHandle([LOST], [NEVER])
    with pytest.raises(ReplicaLost, match="no replica answered the retry within 0.3 s"):
        _collect(handle, retry_within_s=0.3)
    assert handle.calls == 2


def test_a_slow_first_event_of_the_first_attempt_is_not_bounded():
    class Slow(FakeHandle):
        async def _stream(self, script):
            await asyncio.sleep(0.5)  # queued behind other requests: no retry deadline applies
            async for event in super()._stream(script):
                yield event

    assert _collect(Slow([DELTA, DONE]), retry_within_s=0.1) == [DELTA, DONE]


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
