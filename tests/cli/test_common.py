"""What the commands share: KEY=VALUE overrides, and settings from the flags named like their
fields."""

from __future__ import annotations

import argparse

import pytest
from pydantic import BaseModel, ValidationError

from specserve.cli.common import from_flags, parse_overrides


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


class _Settings(BaseModel):
    max_tokens: int = 64
    stop: list[str] = []
    seed: int | None = None
    label: str = "default"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--stop", action="append", default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--out", default="x")  # no field of that name: not read
    return p


def test_from_flags_reads_the_flags_named_like_fields_and_given_values():
    args = _parser().parse_args(["--max-tokens", "5", "--seed", "3"])
    got = from_flags(_Settings, args, stop=args.stop or [])
    assert got == _Settings(max_tokens=5, stop=[], seed=3)  # label: no flag, its default
    assert from_flags(_Settings, _parser().parse_args([]), stop=[]).max_tokens == 16
    assert from_flags(_Settings, args, stop=[], label="given").label == "given"


def test_from_flags_validates():
    args = argparse.Namespace(max_tokens="many", stop=[])
    with pytest.raises(ValidationError, match="max_tokens"):
        from_flags(_Settings, args)
