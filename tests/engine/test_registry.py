"""Name registries: a name registers once; an unknown name fails listing the valid ones."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from specserve.engine.registry import Registry


@dataclass(frozen=True)
class _Entry:
    name: str


def test_a_name_registers_once():
    registry = Registry("widget", "widgets")
    first = registry.register(_Entry("a"))
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        registry.register(_Entry("a"))
    assert registry.get("a") is first and registry.names() == ["a"]
    with pytest.raises(ValueError, match="unknown widget 'b'; valid widgets: a"):
        registry.get("b")
