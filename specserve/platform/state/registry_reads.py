"""The registry's reads: its records from the raw store hashes of one variant (versions, drafter
status, acceptance figures, capture settings), as `Registry` fetched them (state/registry.py)."""

from __future__ import annotations

import json

from specserve.adapters.variants import VariantKey
from specserve.platform.state.records import (
    Acceptance,
    CaptureSettings,
    DrafterStatus,
    VariantState,
    VersionRecord,
)

ACCEPTANCE_FIELDS = tuple(Acceptance.model_fields)  # tokens, forwards, ..., cost_milli


def parse_versions(raw: dict[str, str]) -> list[VersionRecord]:
    return sorted(
        (VersionRecord(**json.loads(body), version=int(v)) for v, body in raw.items()),
        key=lambda r: r.version,
    )


def parse_drafters(key: VariantKey, raw: dict[str, str]) -> dict[str, DrafterStatus]:
    prefix = f"{key.version}:"
    return {
        f[len(prefix) :]: DrafterStatus.model_validate_json(body)
        for f, body in sorted(raw.items())
        if f.startswith(prefix)
    }


def parse_capture(raw: dict[str, str]) -> CaptureSettings:
    """Capture settings from the capture map: on only while its "enabled" guard is there."""
    settings = CaptureSettings.model_validate_json(raw["settings"]) if "settings" in raw else None
    settings = settings or CaptureSettings()
    return settings.model_copy(update={"enabled": "enabled" in raw})


def parse_acceptance(key: VariantKey, raw: dict[str, str]) -> dict[str, Acceptance]:
    figures: dict[str, dict[str, int]] = {}
    for f, value in raw.items():
        version, strategy, name = f.split(":", 2)
        if version == str(key.version) and name in ACCEPTANCE_FIELDS:
            figures.setdefault(strategy, {})[name] = int(value)
    return {s: Acceptance(**v) for s, v in sorted(figures.items())}


def variant_state(
    name: str,
    override: str | None,
    version: int | None,
    versions: dict[str, str],
    drafters: dict[str, str],
    acceptance: dict[str, str],
    broken: dict[str, str],
    capture: dict[str, str],
) -> VariantState | None:
    """A VariantState from the raw hashes of one variant (None: no such variant or version)."""
    records = parse_versions(versions)
    if not records or (version is not None and str(version) not in versions):
        return None
    key = VariantKey(name, records[-1].version if version is None else version)
    return VariantState(
        name=name,
        versions=records,
        override=override,
        version=key.version,
        drafters=parse_drafters(key, drafters),
        acceptance=parse_acceptance(key, acceptance),
        broken={int(v): why for v, why in broken.items()},
        capture=parse_capture(capture),
    )
