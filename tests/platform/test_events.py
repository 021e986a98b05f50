"""Stream events: what a replica yields across Ray (`model_dump`) reads back as the same model,
the replica's name appears only once set, and anything else is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from specserve.platform.events import Delta, Done, DoneInfo, Usage, parse_event


def _done() -> Done:
    info = DoneInfo(
        variant="support",
        version=2,
        strategy="eagle",
        reason="stable",
        tau=2.5,
        load_capped_steps=0,
        forwards=4,
        drafted_by_depth=[4, 2],
        accepted_by_depth=[3, 1],
        train_kind=None,
    )
    usage = Usage(prompt_tokens=3, completion_tokens=10, total_tokens=13)
    return Done(finish_reason="length", usage=usage, specserve=info)


def test_events_read_back_from_their_dicts():
    delta = Delta(text="w3 ", token_ids=[3])
    assert parse_event(delta.model_dump()) == delta
    done = _done()
    assert parse_event(done.model_dump()) == done
    served = done.served_by("replica-1")
    assert parse_event(served.model_dump()).specserve.replica == "replica-1"
    assert done.specserve.replica is None  # served_by copies


def test_the_replica_is_in_the_wire_json_only_once_known():
    assert "replica" not in _done().specserve.model_dump()
    assert _done().served_by("r").specserve.model_dump()["replica"] == "r"
    assert list(_done().specserve.model_dump())[:3] == ["variant", "version", "strategy"]


def test_other_dicts_are_refused():
    with pytest.raises(ValidationError):
        parse_event({"type": "progress", "text": "x"})
    with pytest.raises(ValidationError):
        parse_event({"type": "delta", "text": "x"})  # no token ids
