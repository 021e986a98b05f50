"""The OpenAI model list (`/v1/models`): base models, then the variants a caller may see. The
variant entries are re-read only when the registry's generation moved, and the JSON body is
rendered once per generation and visibility; with the store down, the last list read serves.
"""

from __future__ import annotations

import json
import logging
import threading

from specserve.platform.api.resolve import RegistryReads
from specserve.platform.state.records import VariantInfo
from specserve.platform.state.store import StoreError

log = logging.getLogger(__name__)


class Catalog:
    """The model list of the variants served here (a variant of another base model is left out)."""

    def __init__(self, reads: RegistryReads) -> None:
        self.settings, self.registry = reads.settings, reads.registry
        self.access, self.breaker = reads.access, reads.breaker
        self._entries: tuple[list[tuple[str, dict]], int] | None = None  # (entries, generation)
        self._rendered: tuple[int | None, dict] = (None, {})  # generation, allowed -> JSON body
        self._refresh = threading.Lock()  # one thread re-reads the list, others wait
        self._lock = threading.Lock()

    def body(self, allowed: frozenset[str] | None) -> bytes:
        """The OpenAI model list as JSON: base models, then the variants visible with `allowed`
        (names sorted); rendered once per registry generation and visibility."""
        entries, generation = self._variant_entries()
        with self._lock:
            rendered_at, bodies = self._rendered
            if rendered_at == generation and allowed in bodies:
                return bodies[allowed]
        listing = self._listing(entries, allowed)
        body = json.dumps(listing, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        with self._lock:
            if self._rendered[0] != generation:
                self._rendered = (generation, {})
            self._rendered[1][allowed] = body.encode()
        return body.encode()

    def _listing(self, entries: list[tuple[str, dict]], allowed: frozenset[str] | None) -> dict:
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
        data += [e for name, e in entries if self.access.visible(name, allowed)]
        return {"object": "list", "data": data}

    def _variant_entries(self) -> tuple[list[tuple[str, dict]], int | None]:
        """((name, model entry) of every variant on a served base model, the registry generation
        they were read at), re-read only when the generation moved: replicas see a change on
        their next call. With the store down: the last list read (([], None) if none), as
        resolution keeps serving cached targets."""
        cached = self._entries
        if self.breaker.open:
            return cached or ([], None)
        try:
            generation = self.registry.generation()  # read before the list: never newer than it
            if cached is not None and cached[1] == generation:
                return cached
            with self._refresh:
                cached = self._entries  # refreshed by another thread meanwhile?
                if cached is not None and cached[1] == generation:
                    return cached
                entries = [_entry(info) for info in self.registry.list()]
                served = [(name, e) for name, e in entries if e["parent"] in self.settings.models]
                self._entries = (served, generation)
                return served, generation
        except StoreError as err:
            self.breaker.trip()
            log.warning("registry unreachable (%s); listing cached variants", err)
            return cached or ([], None)


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
