"""Replay n-gram proposers on recorded greedy outputs: τ and speed predicted by the cost curve,
in seconds instead of a model run, and the bound an oracle choosing among the context's copies
would reach.

  record: python scripts/draft_replay.py record --per-task 6 --max-new-tokens 96 --out out.json
  replay: python scripts/draft_replay.py replay out.json --strategy hybrid [--warm] [--oracle]
          [--config counts=null] [--report docs/reports/bench-cpu-bf16-invariant.json]

Replay is exact for proposers that read only the tokens (prompt_lookup; hybrid without drafter
and without the Lookahead window, whose rows need the model): a step accepts the longest draft
path the recorded output follows, plus the bonus token. Predicted speed = tokens / sum of each
step's relative cost (the chain or tree curve at the step's width; one row costs 1).
`--warm`: one n-gram pool across the prompts (a served variant's); `--oracle`: the best copy
of any earlier occurrence of the last token (in the context, and with --warm earlier outputs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specserve.engine.match_stats import common_prefix
from specserve.engine.ngram_pool import NGramPool
from specserve.engine.proposers.base import REGISTRY, ProposerContext
from specserve.engine.proposers.draft_budget import relative_at

REPLAYABLE = ("prompt_lookup", "hybrid")
NO_MODEL = {"hybrid": {"window": None, "use_drafter": False}}


def record(args) -> None:
    from specserve.engine.decode.engine import Engine  # lazy: only recording needs the model
    from specserve.engine.sampling import SamplingParams  # lazy: as above
    from specserve.models.load import load_model  # lazy: as above
    from specserve.tools.bench import load_specbench  # lazy: as above

    loaded = load_model(args.model, dtype=args.dtype)
    engine = Engine(loaded.model, loaded.tokenizer, loaded.eos_token_ids)
    rows = []
    for prompt in load_specbench(Path(args.data), args.per_task, loaded.tokenizer):
        params = SamplingParams(max_new_tokens=args.max_new_tokens)
        result = engine.generate(prompt.ids, params, "ar", None)
        rows.append({"task": prompt.task, "prompt": prompt.ids, "output": result.output_ids})
        print(prompt.task, prompt.question_id, len(result.output_ids), file=sys.stderr)
    Path(args.out).write_text(json.dumps(rows))


def accepted(tree, output: list[int], pos: int) -> int:
    """The longest path of `tree` that output[pos:] follows. Example: tokens (5, 6, 7), parents
    (-1, 0, -1), output [5, 6, 9] -> 2."""
    node, n = -1, 0
    while pos + n < len(output):
        nxt = [
            i for i, p in enumerate(tree.parents) if p == node and tree.tokens[i] == output[pos + n]
        ]
        if not nxt:
            return n
        node, n = nxt[0], n + 1
    return n


def step_cost(draft, curves) -> float:
    tree = draft.tree
    width = 1 + (len(tree) if tree else 0)
    if width == 1:
        return 1.0
    chain = relative_at(curves["chain"], width)
    branches = any(p != i - 1 for i, p in enumerate(tree.parents))
    return max(chain, relative_at(curves["tree"], width)) if branches else chain


def replay(rows, strategy: str, config: dict, curves, warm: bool) -> dict[str, list[float]]:
    spec = REGISTRY.get(strategy)
    cfg = spec.config_type.model_validate({**config, **NO_MODEL.get(strategy, {})})
    pool = NGramPool() if warm else None
    per_task: dict[str, list[float]] = {}  # task -> [tokens, steps, cost]
    for row in rows:
        ctx = ProposerContext(prompt_ids=list(row["prompt"]), vocab_size=1 << 20, pool=pool)
        proposer = spec.build(cfg, ctx)
        tokens, output, pos = list(row["prompt"]), row["output"], 0
        totals = per_task.setdefault(row["task"], [0, 0, 0.0])
        while pos < len(output):
            draft = proposer.propose(tokens)
            n = min((accepted(draft.tree, output, pos) if draft.tree else 0) + 1, len(output) - pos)
            tokens += output[pos : pos + n]
            pos += n
            proposer.observe(draft, [], tokens)
            totals[1] += 1
            totals[2] += step_cost(draft, curves)
        totals[0] += len(output)
    return per_task


def oracle(rows, curves, warm: bool) -> dict[str, list[float]]:
    """Each step drafts the one earlier copy (after an occurrence of the last token) that the
    output follows longest, as a chain."""
    per_task: dict[str, list[float]] = {}
    earlier: list[list[int]] = []
    for row in rows:
        seq, pos = row["prompt"] + row["output"], len(row["prompt"])
        totals = per_task.setdefault(row["task"], [0, 0, 0.0])
        while pos < len(seq):
            sources = [seq[:pos]] + (earlier if warm else [])
            best = max(
                (
                    common_prefix(src[j:], seq[pos:])
                    for src in sources
                    for j in range(1, len(src))
                    if src[j - 1] == seq[pos - 1]
                ),
                default=0,
            )
            pos += min(best + 1, len(seq) - pos)
            totals[1] += 1
            totals[2] += relative_at(curves["chain"], best + 1) if best else 1.0
        totals[0] += len(row["output"])
        earlier.append(row["output"])
    return per_task


def report(name: str, per_task: dict[str, list[float]]) -> None:
    tokens, steps, cost = (sum(t[i] for t in per_task.values()) for i in range(3))
    tasks = " ".join(f"{task} {t[0] / t[1]:.2f}/{t[0] / t[2]:.2f}" for task, t in per_task.items())
    print(f"{name:24s} τ {tokens / steps:.3f} predicted {tokens / cost:.3f} | {tasks}")


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--model", default="smollm2-135m")
    rec.add_argument("--dtype", default="bfloat16")
    rec.add_argument("--data", default="../shared/bench/specbench_dev.jsonl")
    rec.add_argument("--per-task", type=int, default=6)
    rec.add_argument("--max-new-tokens", type=int, default=96)
    rec.add_argument("--out", required=True)
    rep = sub.add_parser("replay")
    rep.add_argument("recorded")
    rep.add_argument("--strategy", choices=REPLAYABLE, default="hybrid")
    rep.add_argument("--config", action="append", default=[], help="KEY=VALUE (JSON value)")
    rep.add_argument("--report", default="docs/reports/bench-cpu-bf16-invariant.json")
    rep.add_argument("--warm", action="store_true")
    rep.add_argument("--oracle", action="store_true")
    args = parser.parse_args()
    if args.command == "record":
        record(args)
        return
    rows = json.loads(Path(args.recorded).read_text())
    hybrid = json.loads(Path(args.report).read_text())["strategy_configs"]["hybrid"]
    curves = {
        name: {int(w): c for w, c in hybrid[key].items()}
        for name, key in (("chain", "relative_cost"), ("tree", "relative_tree_cost"))
    }
    config = {k: _value(v) for k, v in (item.split("=", 1) for item in args.config)}
    if args.strategy == "hybrid":
        config = {"relative_cost": curves["chain"], "relative_tree_cost": curves["tree"], **config}
    report("prompt_lookup", replay(rows, "prompt_lookup", {}, curves, args.warm))
    report(args.strategy, replay(rows, args.strategy, config, curves, args.warm))
    if args.oracle:
        report("oracle", oracle(rows, curves, args.warm))


if __name__ == "__main__":
    main()
