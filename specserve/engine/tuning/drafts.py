"""Choose draft parameters for this model and device: maximize τ / cost(width).

τ (tokens per forward) and the mean verify width of each candidate are measured by decoding
calibration prompts (Python's docs, never benchmark data); the device's cost curve prices each
width. The choice and the whole table are cached per model, device and dtype.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from specserve.engine.decode.core import Decoder
from specserve.engine.proposers import REGISTRY
from specserve.engine.sampling import SamplingParams
from specserve.engine.tuning.cost import CostCurve, cache_stem, cost_curve_path

CANDIDATES: dict[str, list[dict]] = {
    "prompt_lookup": [
        {"min_ngram": n, "draft_len": d, "max_draft_len": top, "max_matches": m}
        for n in (1, 2)
        for d in (3, 5)
        for top in (0, 16)
        for m in (1, 3)
    ],
    "lookahead": [
        {"window": w, "ngram": n, "guesses": g}
        for (w, n, g) in [
            (1, 2, 1),
            (2, 2, 2),
            (2, 3, 1),
            (2, 3, 2),
            (3, 3, 3),
            (4, 3, 4),
            (3, 4, 3),
            (5, 4, 5),
            (6, 4, 6),
            (7, 5, 7),
            (10, 5, 10),
            (15, 5, 15),
            (20, 7, 20),
        ]
    ],
    "hybrid": [
        {"window": None, "budget": 16},
        {"window": {"window": 2, "ngram": 3, "guesses": 0}, "budget": 16},
        {"window": {"window": 4, "ngram": 3, "guesses": 0}, "budget": 16},
        {"window": {"window": 3, "ngram": 4, "guesses": 0}, "budget": 24, "pool_guesses": 8},
    ],
}


def with_cost(strategy: str, config: dict, curve: CostCurve) -> dict:
    """`config` with the device's cost curve where the strategy sizes its drafts by it (a
    `relative_cost` field: verify cost per measured width relative to one row; and a
    `relative_tree_cost` field where it prices trees apart)."""
    fields = REGISTRY.get(strategy).config_type.model_fields
    if "relative_cost" not in fields or config.get("relative_cost"):
        return config
    config = {**config, "relative_cost": {w: round(curve.relative(w), 4) for w in sorted(curve.ms)}}
    if "relative_tree_cost" in fields and curve.tree_ms:
        trees = {w: round(curve.relative_tree(w), 4) for w in sorted(curve.tree_ms)}
        config["relative_tree_cost"] = trees
    return config


class Trial(BaseModel):
    config: dict
    tau: float
    mean_width: float  # tokens scored per decode step
    mean_cost: float  # mean cost of a decode step relative to a 1-token forward
    predicted_speedup: float  # τ / mean_cost, against ar's 1.0


class Tuned(BaseModel):
    strategy: str
    device: str
    config: dict
    trials: list[Trial]

    @property
    def best(self) -> Trial:
        return max(self.trials, key=lambda t: t.predicted_speedup)


def tune(
    engine: Decoder,
    strategy: str,
    curve: CostCurve,
    prompts: list[list[int]],
    max_new_tokens: int = 48,
    candidates: list[dict] | None = None,
    log: Callable[[str], object] = lambda msg: None,
) -> Tuned:
    params = SamplingParams(max_new_tokens=max_new_tokens)
    trials = []
    grid = candidates or CANDIDATES.get(strategy, [{}])
    for i, config in enumerate(grid, 1):
        config = with_cost(strategy, config, curve)
        runs = [engine.generate(ids, params, strategy, config) for ids in prompts]
        tokens = sum(len(r.output_ids) for r in runs)
        forwards = sum(r.forwards for r in runs)
        widths = [w for r in runs for w in r.widths]
        cost = sum(curve.relative(w) for w in widths) / len(widths)  # per step, vs ar's 1.0
        tau = tokens / forwards
        trials.append(
            Trial(
                config=config,
                tau=tau,
                mean_width=sum(widths) / len(widths),
                mean_cost=cost,
                predicted_speedup=tau / cost,
            )
        )
        log(f"  [{i}/{len(grid)}] {strategy} {config}: tau {tau:.2f}, step cost {cost:.2f}x")
    best = max(trials, key=lambda t: t.predicted_speedup)
    return Tuned(strategy=strategy, device=curve.device, config=best.config, trials=trials)


def tuned_path(cache_dir: Path, curve: CostCurve, strategy: str) -> Path:
    stem = cache_stem(curve.model_id, curve.device, curve.dtype)
    return Path(cache_dir) / "tuned" / f"{stem}-{strategy}.json"


def load_or_tune(
    engine, strategy, curve, prompts, cache_dir: Path, retune=False, log=lambda msg: None
) -> Tuned:
    path = tuned_path(cache_dir, curve, strategy)
    if path.exists() and not retune:
        return Tuned.model_validate(json.loads(path.read_text()))
    tuned = tune(engine, strategy, curve, prompts, log=log)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tuned.model_dump_json(indent=1))
    return tuned


def cached_choices(cache_dir: Path, model_id: str, device, dtype, strategies: list[str]):
    """(cost curve or None, {strategy: tuned config}) from an earlier `tune`/`bench` on this model
    and device; nothing is measured here (a server starts fast and uses defaults until tuned).
    An untuned strategy that sizes its drafts by the curve gets its defaults with the curve."""
    curve_file = cost_curve_path(Path(cache_dir), model_id, device, dtype)
    if not curve_file.exists():
        return None, {}
    curve = CostCurve.model_validate_json(curve_file.read_text())
    configs = {}
    for strategy in strategies:
        path = tuned_path(Path(cache_dir), curve, strategy)
        if path.exists():
            configs[strategy] = Tuned.model_validate_json(path.read_text()).config
        elif priced := with_cost(strategy, {}, curve):
            configs[strategy] = priced
    return curve, configs
