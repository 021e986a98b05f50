"""Trained drafters on the command line: `--drafter-dir` loaded and checked against the served
model (`load_drafters`), and each one's tree sized to this device (`drafter_config`)."""

from __future__ import annotations

from pathlib import Path

from specserve.cli.common import log


def load_drafters(drafter_dir: Path, target, kinds: list[str]) -> dict:
    """kind -> Drafter from DIR/<kind>/ (or DIR itself when it holds one artifact), each checked
    against `target` (a `CommandTarget`: the served model and its adapter)."""
    from specserve.engine.drafters.artifact import (  # lazy: +3 s (torch, transformers)
        MANIFEST,
        base_weights_sha256,
        load_drafter,
        read_manifest,
    )

    if not kinds:
        return {}
    loaded = target.loaded
    weights = base_weights_sha256(loaded.model)
    out = {}
    for kind in kinds:
        path = Path(drafter_dir) / kind
        if not (path / MANIFEST).exists():
            path = Path(drafter_dir)
            if not (path / MANIFEST).exists() or read_manifest(path).kind != kind:
                raise ValueError(f"drafter-dir: no {kind} drafter in {drafter_dir}")
        out[kind] = load_drafter(
            path, loaded.model, loaded.model_id, target.adapter_sha256, weights
        )
        for note in out[kind].notes:
            log(f"note: {note}")
    return out


def drafter_config(drafter, curve, info: dict | None = None) -> dict:
    """Tree size for this drafter on this device: expected τ / (verify + draft cost). `info`
    receives the measured draft cost and the predicted speedup."""
    from specserve.engine.drafters.budget import (  # lazy: +3 s (torch, transformers)
        measure_step_cost,
        tree_config,
    )

    step = measure_step_cost(drafter, curve)
    config = tree_config(drafter.kind, drafter.manifest.accept_rates, curve, step)
    if info is not None:
        info["draft_step_cost"] = round(step, 3)  # relative to a 1-token target forward
        info["predicted_speedup"] = config["predicted_speedup"]
    config.pop("predicted_speedup")
    return config
