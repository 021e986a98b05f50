"""Where drafter jobs write, under the platform's cache: a variant@version's drafter directories
(one per retrain revision) and a retrain's scratch directory for its traffic's teacher data."""

from __future__ import annotations

import uuid
from pathlib import Path

from specserve.adapters.variants import VariantKey
from specserve.platform.settings import PlatformSettings


def drafter_dir(settings: PlatformSettings, key: VariantKey, kind: str, revision: int = 1) -> Path:
    """Where a variant@version's drafter of `kind` lives: <cache>/drafters/<name>@<version>/<kind>
    (a retrain's revision n > 1: .../<kind>.r<n>)."""
    name = kind if revision == 1 else f"{kind}.r{revision}"
    return settings.resolved_cache_dir() / "drafters" / str(key) / name


def scratch_dir(settings: PlatformSettings, key: str) -> Path:
    """A directory of one job's own for the traffic's teacher data (removed when it ends)."""
    return settings.resolved_cache_dir() / "traffic-scratch" / f"{key}-{uuid.uuid4().hex[:8]}"
