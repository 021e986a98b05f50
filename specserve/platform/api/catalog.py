"""The OpenAI model list (`/v1/models`): base models, then the variants a caller may see, re-read
only when the registry's generation moved and rendered once per generation and visibility; with
the store down, the last list read serves, marked stale (`specserve.stale`, header in routes.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading

from specserve.platform.api.resolve import RegistryReads
from specserve.platform.state.records import VariantInfo
from specserve.platform.state.store import StoreError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ModelList:
    """A rendered /v1/models body; `stale`: the store is down and the variants are the last list
    read (none if it was never read)."""

    body: bytes
    stale: bool


@dataclasses.dataclass(frozen=True)
class _Entries:
    """(name, model entry) of every variant on a served base model, as read at `generation`."""

    variants: list[tuple[str, dict]]
    generation: int | None
    stale: bool


class Catalog:
    """The model list of the variants served here (a variant of another base model, or one named
    like a base model, is left out: an id is listed once)."""

    def __init__(self, reads: RegistryReads) -> None:
        self.settings, self.registry = reads.settings, reads.registry
        self.access, self.breaker = reads.access, reads.breaker
        self._entries: _Entries | None = None  # the last list read from the store
        self._rendered: tuple[int | None, dict] = (None, {})  # generation, (allowed, stale) -> body
        self._refresh = threading.Lock()  # one thread re-reads the list, others wait
        self._lock = threading.Lock()

    def models(self, allowed: frozenset[str] | None) -> ModelList:
        """The OpenAI model list: base models, then the variants visible with `allowed` (names
        sorted); rendered once per registry generation, visibility and staleness."""
        entries = self._variant_entries()
        key = (allowed, entries.stale)
        with self._lock:
            rendered_at, bodies = self._rendered
            if rendered_at == entries.generation and key in bodies:
                return bodies[key]
        listing = self._listing(entries, allowed)
        body = json.dumps(listing, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        models = ModelList(body.encode(), entries.stale)
        with self._lock:
            if self._rendered[0] != entries.generation:
                self._rendered = (entries.generation, {})
            self._rendered[1][key] = models
        return models

    def _listing(self, entries: _Entries, allowed: frozenset[str] | None) -> dict:
        """The OpenAI model list of base models and the visible `entries`."""
        data = [
            {
                "id": m,
                "object": "model",
                "created": 0,
                "owned_by": "specserve",
                "specserve": {"kind": "base"},
            }
            for m in self.settings.models
        ]
        data += [e for name, e in entries.variants if self.access.visible(name, allowed)]
        return {"object": "list", "data": data, "specserve": {"stale": entries.stale}}

    def _variant_entries(self) -> _Entries:
        """The variant entries, re-read only when the generation moved: replicas see a change on
        their next call. With the store down: the last list read, stale (none if never read), as
        resolution keeps serving cached targets."""
        if self.breaker.open:
            return self._stale()
        try:
            generation = self.registry.generation()  # read before the list: never newer than it
            cached = self._entries
            if cached is not None and cached.generation == generation:
                return cached
            with self._refresh:
                cached = self._entries  # refreshed by another thread meanwhile?
                if cached is not None and cached.generation == generation:
                    return cached
                self._entries = _Entries(self._read(), generation, stale=False)
                return self._entries
        except StoreError as err:
            self.breaker.trip()
            log.warning("registry unreachable (%s); listing cached variants", err)
            return self._stale()

    def _read(self) -> list[tuple[str, dict]]:
        """Every registered variant on a served base model whose name is no served model id."""
        served = self.settings.models
        entries = [_entry(info) for info in self.registry.list()]
        return [(name, e) for name, e in entries if e["parent"] in served and name not in served]

    def _stale(self) -> _Entries:
        cached = self._entries
        if cached is None:
            return _Entries([], None, stale=True)
        return dataclasses.replace(cached, stale=True)


def _entry(info: VariantInfo) -> tuple[str, dict]:
    current = info.current
    return info.name, {
        "id": info.name,
        "object": "model",
        "created": int(current.created_at),
        "owned_by": "specserve",
        "parent": current.base_model,
        "specserve": {"kind": "variant", "version": current.version, "override": info.override},
    }
