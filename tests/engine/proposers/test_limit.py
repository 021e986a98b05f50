"""Load shedding: a limited config never drafts more than k tokens per step."""

from __future__ import annotations

import random

import pytest

from specserve.engine.proposers import REGISTRY, ProposerContext

CONFIGS = {
    "lookahead": [
        {},
        {"window": 5, "ngram": 5, "guesses": 5},
        {"window": 1, "ngram": 2, "guesses": 0},
    ],
    "prompt_lookup": [
        {},
        {"draft_len": 3, "max_draft_len": 12, "max_matches": 4},
        {"max_matches": 1},
    ],
    "ar": [{}],
}


def _max_width(strategy: str, config, steps: int = 12) -> int:
    rng = random.Random(0)
    tokens = [rng.randrange(6) for _ in range(40)]  # repetitive: lookups and pools find drafts
    proposer = REGISTRY.get(strategy).build(config, ProposerContext(list(tokens), 96, 0))
    widest = 0
    for _ in range(steps):
        draft = proposer.propose(tokens)
        aux = len(draft.aux.tokens) if draft.aux else 0
        widest = max(widest, len(draft.tree) + aux)
        accepted = [draft.tree.tokens[0]] if len(draft.tree) else []
        tokens = tokens + accepted + [rng.randrange(6)]
        rows = len(draft.aux.logit_rows) if draft.aux else 0  # the verifier reads these aux rows
        proposer.observe(draft, [rng.randrange(6) for _ in range(rows)], tokens)
    return widest


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6, 9])
@pytest.mark.parametrize("strategy", list(CONFIGS))
def test_limited_config_drafts_at_most_k(strategy, k):
    for raw in CONFIGS[strategy]:
        config = REGISTRY.config(strategy, raw)
        limited = REGISTRY.limited(strategy, config, k)
        assert _max_width(strategy, limited) <= k, (raw, limited)
        assert type(limited) is type(config)


def test_unlimited_configs_do_draft_more():
    assert (
        _max_width(
            "lookahead", REGISTRY.config("lookahead", {"window": 5, "ngram": 5, "guesses": 5})
        )
        > 9
    )


def test_worked_examples():
    la = REGISTRY.config("lookahead", {"window": 4, "ngram": 3, "guesses": 2})
    assert REGISTRY.limited("lookahead", la, 6).model_dump(
        include={"window", "ngram", "guesses"}
    ) == {"window": 3, "ngram": 3, "guesses": 0}
    assert REGISTRY.limited("lookahead", la, 1).model_dump(
        include={"window", "ngram", "guesses"}
    ) == {"window": 1, "ngram": 2, "guesses": 0}
    with pytest.raises(ValueError, match="max_draft_tokens"):
        REGISTRY.limited("lookahead", la, 0)
