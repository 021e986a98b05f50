"""A replica's trained drafters, each loaded once per (artifact, adapter) and checked against the
base model's weights and the variant's adapter (a drafter of another version is refused), with
its device-sized tree config and one draft level's measured cost."""

from __future__ import annotations

from typing import NamedTuple

from specserve.engine.drafters.artifact import Drafter, base_weights_sha256, load_drafter
from specserve.engine.drafters.budget import drafter_config
from specserve.platform.requests import Target


class LoadedDrafter(NamedTuple):
    """A drafter checked against this replica's model, as the strategy choice uses it."""

    drafter: Drafter
    config: dict | None  # its device-sized tree config (None: default trees)
    level_cost: float  # one draft level's cost, in target forwards


class DrafterCache:
    """Drafters of one base model, keyed by (artifact dir, adapter sha256)."""

    def __init__(self, model, model_id: str, curve=None) -> None:
        """`curve`: the device cost curve that sizes trees (None: default trees, cost 0)."""
        self.model = model
        self.model_id = model_id
        self.curve = curve
        self._loaded: dict[tuple[str, str], LoadedDrafter] = {}
        self._weights_sha: str | None = None

    def get(self, target: Target, kind: str) -> LoadedDrafter:
        """The target's `kind` drafter; ValueError / OSError when it has none or it mismatches."""
        found = [d for d in target.drafters if d.kind == kind and d.artifact_dir]
        if not found:
            raise ValueError(f"no {kind} artifact registered for {target.key or 'the base model'}")
        path = found[0].artifact_dir
        cache_key = (path, target.adapter_sha256 or "")
        if cache_key not in self._loaded:
            if self._weights_sha is None:
                self._weights_sha = base_weights_sha256(self.model)
            drafter = load_drafter(
                path, self.model, self.model_id, target.adapter_sha256, self._weights_sha
            )
            config, level_cost = None, 0.0
            if self.curve is not None:
                config, level_cost = drafter_config(drafter, self.curve)
            self._loaded[cache_key] = LoadedDrafter(drafter, config, level_cost)
        return self._loaded[cache_key]

    def level_cost(self, drafter) -> float:
        """One draft level's cost of a drafter loaded here (0 for any other, or None)."""
        return next((d.level_cost for d in self._loaded.values() if d.drafter is drafter), 0.0)
