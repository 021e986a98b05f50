"""One prefill for several requests with the same prompt (n choices): once the leader holds every
prompt token but the last in its cache, each follower takes a copy of that cache and of its
prefill features and needs only the last token's step (the one that also verifies its first
draft), so prompt positions are computed once whatever n is."""

from __future__ import annotations

from specserve.engine import hf_internals
from specserve.engine.decode.state import RequestState


def can_share(leader: RequestState, follower: RequestState) -> bool:
    """Same prompt, same adapter, the follower not started (its whole prompt still pending)."""
    return (
        leader.tokens[: leader.prompt_len] == follower.tokens[: follower.prompt_len]
        and leader.adapter == follower.adapter
        and follower.pending == follower.tokens
        and not follower.output_ids
    )


def ready_to_share(leader: RequestState) -> bool:
    """The leader's prompt is in its cache but for the last token, which its next step feeds."""
    return len(leader.pending) == 1 and not leader.output_ids


def share_prefill(leader: RequestState, follower: RequestState) -> int:
    """Give `follower` the leader's prefilled prompt (a cache copy, the last token pending);
    returns the prompt tokens it will not compute again.

    Example: a 40-token prompt: the follower starts with 39 positions cached and 1 pending.
    """
    if not (ready_to_share(leader) and can_share(leader, follower)):
        raise ValueError("share_prefill: the leader must hold the same prompt up to its last token")
    follower.cache = hf_internals.copy_cache(leader.cache)
    follower.pending = list(leader.pending)
    follower.prefill_features = list(leader.prefill_features)  # EAGLE reads the prompt's
    return follower.prompt_len - 1
