"""What the commands share: KEY=VALUE overrides, and settings from the flags named like their
fields."""

from __future__ import annotations

import argparse

import pytest
from pydantic import BaseModel, ValidationError

from specserve.cli.common import from_flags, nested_overrides, parse_overrides


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


class _Inner(BaseModel):
    lr: float = 1e-3
    layers: tuple[int, ...] = (-1,)


class _Outer(BaseModel):
    budget: float = 20.0
    inner: _Inner = _Inner()
    extra: dict = {}


def test_nested_overrides_build_the_nested_settings():
    got = nested_overrides(["inner.layers=[3,15,-1]", "inner.lr=0.002", "budget=5"], _Outer)
    assert got == {"inner": {"layers": [3, 15, -1], "lr": 0.002}, "budget": 5}
    assert _Outer.model_validate(got).inner.layers == (3, 15, -1)
    # below a field that is not a model nothing is checked (a dict's keys are its own)
    assert nested_overrides(["extra.anything=1"], _Outer) == {"extra": {"anything": 1}}


def test_nested_overrides_name_the_valid_fields_of_the_level():
    with pytest.raises(ValueError, match=r"unknown 'lrr' in inner; valid: lr, layers"):
        nested_overrides(["inner.lrr=1"], _Outer)
    with pytest.raises(
        ValueError, match=r"unknown 'nope' in settings; valid: budget, inner, extra"
    ):
        nested_overrides(["nope=1"], _Outer)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        nested_overrides(["inner.lr"], _Outer)
