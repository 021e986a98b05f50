"""A model server's final event for tests that stand in for one (`done_event`): shared by the
gateway, backend and drain tests, so a field added to `Done` changes one place."""

from __future__ import annotations

from specserve.platform.events import Done, DoneInfo, Usage


def done_event(tokens: int = 1, finish_reason: str = "length") -> Done:
    """A base-model request's Done: `tokens` completion tokens, strategy ar, one prompt token."""
    info = DoneInfo(
        variant=None,
        version=None,
        strategy="ar",
        reason="test",
        tau=1.0,
        load_capped_steps=0,
        forwards=tokens,
        drafted_by_depth=[],
        accepted_by_depth=[],
        train_kind=None,
    )
    usage = Usage(prompt_tokens=1, completion_tokens=tokens, total_tokens=tokens + 1)
    return Done(finish_reason=finish_reason, usage=usage, specserve=info)
