"""Acceptance of the two lossless sampled verifiers on the same drafts, measured in one run: the
position-keyed seeded rule (engine/seeded.py, what every sampled request uses) against recursive
rejection sampling (engine/verify.py `sample_accept`, one-hot drafts). Prints τ per strategy.
Usage: python scripts/sampling_acceptance.py --drafter-dir ~/.cache/specserve/drafters/smollm2-135m"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from pathlib import Path

import torch

from specserve.engine.decode.engine import Engine
from specserve.engine.sampling import SamplingParams

CONFIGS = {  # trees with siblings, where the two rules could differ
    "prompt_lookup": None,
    "lookahead": {"window": 3, "ngram": 3, "guesses": 3},
    "medusa": {"tree_size": 8},
    "eagle": {"depth": 3, "topk": 2, "total_tokens": 8},
}


class RejectionEngine(Engine):
    """The engine with every sampled draft verified by recursive rejection sampling: each tree
    carries its one-hot draft distribution, the path `Engine.accept` sends to `sample_accept`."""

    @staticmethod
    def accept(state, draft, out):
        tree = draft.tree
        if state.params.greedy or tree.draft_probs is not None or not len(tree):
            return Engine.accept(state, draft, out)
        vocab = out.tree_logits.shape[-1]
        onehot = torch.nn.functional.one_hot(torch.tensor(tree.tokens), vocab).float()  # [n, V]
        tree = dataclasses.replace(tree, draft_probs=onehot)
        return Engine.accept(state, dataclasses.replace(draft, tree=tree), out)


def _mean_se(values: list[float]) -> tuple[float, float]:
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return statistics.fmean(values), se


def main() -> None:
    from specserve.engine.drafters.artifact import base_weights_sha256, load_drafter
    from specserve.models.load import load_model
    from specserve.tools.bench import load_specbench

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--drafter-dir", type=Path, default=None, help="DIR/medusa, DIR/eagle")
    ap.add_argument("--data", type=Path, default=Path("../shared/bench/specbench_dev.jsonl"))
    ap.add_argument("--per-task", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--strategies", default="prompt_lookup,lookahead,medusa,eagle")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    loaded = load_model(args.model, dtype="float32")
    names = [s for s in args.strategies.split(",") if s]
    drafters, weights = {}, base_weights_sha256(loaded.model)
    for kind in [n for n in names if n in ("medusa", "eagle")]:
        drafters[kind] = load_drafter(
            args.drafter_dir / kind, loaded.model, loaded.model_id, None, weights
        )
    engines = {
        "seeded": Engine(loaded.model, loaded.tokenizer, loaded.eos_token_ids, drafters=drafters),
        "rejection": RejectionEngine(
            loaded.model, loaded.tokenizer, loaded.eos_token_ids, drafters=drafters
        ),
    }
    prompts = load_specbench(args.data, args.per_task, loaded.tokenizer)
    report = {"model": loaded.model_id, "temperature": args.temperature, "strategies": {}}
    for name in names:
        taus: dict[str, list[float]] = {rule: [] for rule in engines}
        seconds = dict.fromkeys(engines, 0.0)
        for prompt in prompts:
            for seed in range(args.seeds):
                for rule, engine in engines.items():  # interleaved: same load for both rules
                    params = SamplingParams(
                        max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature,
                        seed=1000 + seed,
                        ignore_eos=True,
                    )
                    began = time.perf_counter()
                    result = engine.generate(prompt.ids, params, name, CONFIGS.get(name))
                    seconds[rule] += time.perf_counter() - began
                    taus[rule].append(result.tau)
        row = {rule: dict(zip(("tau", "se"), _mean_se(v), strict=True)) for rule, v in taus.items()}
        row["tau_ratio_seeded_over_rejection"] = row["seeded"]["tau"] / row["rejection"]["tau"]
        row["time_ratio_seeded_over_rejection"] = seconds["seeded"] / seconds["rejection"]
        row["runs"] = len(taus["seeded"])
        report["strategies"][name] = row
        print(
            f"{name}: τ seeded {row['seeded']['tau']:.3f} ± {row['seeded']['se']:.3f}, "
            f"rejection {row['rejection']['tau']:.3f} ± {row['rejection']['se']:.3f} "
            f"(ratio {row['tau_ratio_seeded_over_rejection']:.3f}; time ratio "
            f"{row['time_ratio_seeded_over_rejection']:.3f}; {row['runs']} runs each)",
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
