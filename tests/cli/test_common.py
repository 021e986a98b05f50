"""What the commands share: KEY=VALUE overrides."""

from __future__ import annotations

import pytest

from specserve.cli.common import parse_overrides


def test_parse_overrides():
    assert parse_overrides(["window=5", "seed_from_prompt=false", "x=abc"], scoped=False) == {
        "window": 5,
        "seed_from_prompt": False,
        "x": "abc",
    }
    assert parse_overrides(["lookahead.window=5"], scoped=True) == {"lookahead": {"window": 5}}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_overrides(["window"], scoped=False)
    with pytest.raises(ValueError, match="STRATEGY.KEY=VALUE"):
        parse_overrides(["window=5"], scoped=True)
