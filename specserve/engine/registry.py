"""Name registries (strategies, drafter kinds): each name registered once; looking up an unknown
name fails listing the valid ones."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    """Name -> entry, each name registered once; `get` of an unknown name fails listing the valid
    ones. `what` / `plural` name the entries in messages ("strategy" / "strategies")."""

    def __init__(self, what: str, plural: str, error: type[ValueError] = ValueError) -> None:
        self._what = what
        self._plural = plural
        self._error = error
        self._entries: dict[str, T] = {}

    def register(self, entry: T) -> T:
        if entry.name in self._entries:
            raise ValueError(f"{self._what} {entry.name!r} is already registered")
        self._entries[entry.name] = entry
        return entry

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise self._error(
                f"{self._what}: unknown {self._what} {name!r}; "
                f"valid {self._plural}: {', '.join(self.names())}"
            ) from None
