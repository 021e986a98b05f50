"""`specserve bench`: our strategies against transformers `generate()` on Spec-Bench prompts.

Every method decodes the same chat-templated prompts greedily, interleaved prompt by prompt so
machine noise hits all alike; the report gives tokens/s, τ, speedup over `hf_ar` and whether the
token ids equal our `ar` (the JSON contract is in `build_report`).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specserve.engine import row_tiles
from specserve.engine.decode.engine import Engine
from specserve.engine.lora.batch import is_peft_model, lora_rows
from specserve.engine.ngram_pool import NGramPool
from specserve.engine.prompts import encode_prompt
from specserve.engine.sampling import SamplingParams
from specserve.engine.ties import check_outputs
from specserve.engine.tuning.cost import sync_device

BASELINES = ("hf_ar", "hf_pld", "hf_ar_fp32")  # hf_ar_fp32: generate() on a float32 copy


@dataclass(frozen=True)
class BenchPrompt:
    task: str
    question_id: int
    ids: list[int]


@dataclass(frozen=True)
class MethodRun:
    """One greedy decode of one prompt by one method: its output, wall time and target forwards;
    ours also give their decode steps' verify widths, accepted draft tokens by source, and the
    seconds their decode steps spent drafting and verifying."""

    output: list[int]
    seconds: float
    forwards: int
    widths: list[int] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0


@dataclass
class MethodTotals:
    outputs: dict[int, list[int]] = field(default_factory=dict)  # question_id -> output ids
    by_task: dict[str, list[float]] = field(default_factory=dict)  # task -> [tokens, s, forwards]
    widths: list[int] = field(default_factory=list)  # tokens scored by each decode step (ours)
    accepted_by_source: Counter = field(default_factory=Counter)  # hybrid: eagle/prompt/pool
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    def add(self, prompt: BenchPrompt, run: MethodRun) -> None:
        self.outputs[prompt.question_id] = run.output
        self.widths += run.widths
        self.accepted_by_source.update(run.sources)
        self.draft_seconds += run.draft_seconds
        self.verify_seconds += run.verify_seconds
        row = self.by_task.setdefault(prompt.task, [0, 0.0, 0])
        row[0] += len(run.output)
        row[1] += run.seconds
        row[2] += run.forwards

    @property
    def draft_cost(self) -> float | None:
        """Drafting time over verifying time in decode steps: a draft step's cost as a share
        of a target verify step's (None: nothing drafted, or not timed)."""
        if not self.draft_seconds or not self.verify_seconds:
            return None
        return self.draft_seconds / self.verify_seconds


def load_specbench(path: Path, per_task: int, tokenizer) -> list[BenchPrompt]:
    """The first `per_task` prompts of each task (first turn, chat template), in file order."""
    if per_task < 1:
        raise ValueError("per_task: must be at least 1")
    taken: dict[str, int] = {}
    prompts = []
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        if taken.get(row["task"], 0) >= per_task:
            continue
        taken[row["task"]] = taken.get(row["task"], 0) + 1
        ids = encode_prompt(tokenizer, row["turns"][0])  # chat template when the model has one
        prompts.append(BenchPrompt(row["task"], row["question_id"], ids))
    return prompts


class ForwardCounter:
    """Counts top-level forward calls of a model (for τ of `generate()` baselines)."""

    def __init__(self, model) -> None:
        self.count = 0
        self._handle = model.register_forward_hook(self._hook)

    def _hook(self, *_) -> None:
        self.count += 1

    def close(self) -> None:
        self._handle.remove()


def run_hf(
    model, ids: list[int], max_new_tokens: int, eos_ids, pld: bool, adapter: str | None = None
) -> tuple[list[int], int]:
    """(output ids, forwards) of greedy `generate()` as users run it (no row tiles), LoRA `adapter`
    applied by `lora_rows`; with `pld`, prompt lookup of 10 tokens."""
    counter = ForwardCounter(model.get_base_model() if is_peft_model(model) else model)
    extra = {"prompt_lookup_num_tokens": 10} if pld else {}
    try:
        with torch.inference_mode(), lora_rows(model, [adapter]), row_tiles.untiled(model):
            input_ids = torch.tensor([ids], device=model.device)
            out = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=sorted(eos_ids),
                pad_token_id=min(eos_ids),
                **extra,
            )
    finally:
        counter.close()
    return out[0, len(ids) :].tolist(), counter.count


def run_method(
    engine: Engine,
    name: str,
    config: dict | None,
    ids,
    max_new_tokens,
    adapter=None,
    fp32=None,
    pool: NGramPool | None = None,
):
    """One greedy decode (with LoRA `adapter` if given). `fp32`: the float32 copy of the model
    `hf_ar_fp32` runs on; `pool`: the n-gram pool to draft from and feed (None: a fresh one)."""
    sync_device(engine.model.device)
    start = time.perf_counter()
    if name in BASELINES:
        model = fp32 if name == "hf_ar_fp32" else engine.model
        if model is None:
            raise ValueError("hf_ar_fp32: no float32 copy of the model was given")
        output, forwards = run_hf(
            model, ids, max_new_tokens, engine.eos_ids, pld=name == "hf_pld", adapter=adapter
        )
        sync_device(engine.model.device)
        return MethodRun(output, time.perf_counter() - start, forwards)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    result = engine.generate(ids, params, name, config, pool=pool, adapter=adapter)
    sync_device(engine.model.device)
    return MethodRun(
        result.output_ids,
        time.perf_counter() - start,
        result.forwards,
        result.widths,
        result.accepted_by_source,
        result.draft_seconds,
        result.verify_seconds,
    )


def run_bench(
    engine: Engine,
    prompts: list[BenchPrompt],
    methods: dict[str, dict | None],
    max_new_tokens: int,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
    adapter: str | None = None,
    fp32=None,
    pools: dict[str, NGramPool] | None = None,
) -> dict[str, MethodTotals]:
    """Every prompt by every method (one warm-up each), base + `adapter`; `fp32`: the float32 copy
    for `hf_ar_fp32`; `pools`: n-gram pools kept across prompts (`warm_pools`), else fresh ones."""
    for name, config in methods.items():
        run_method(engine, name, config, prompts[0].ids, 4, adapter, fp32)
    pools = pools or {}
    totals = {name: MethodTotals() for name in methods}
    for i, prompt in enumerate(prompts, 1):
        line = []
        for name, config in methods.items():
            run = run_method(
                engine, name, config, prompt.ids, max_new_tokens, adapter, fp32, pools.get(name)
            )
            totals[name].add(prompt, run)
            n = len(run.output)
            line.append(f"{name} {n / run.seconds:.1f} tok/s τ {n / run.forwards:.2f}")
        log(f"[{i}/{len(prompts)}] {prompt.task}#{prompt.question_id}: " + " | ".join(line))
    return totals


def warm_pools(methods) -> dict[str, NGramPool]:
    """One n-gram pool per method, for `run_bench` to keep across the prompts."""
    return {name: NGramPool() for name in methods}


def _rate(rows) -> tuple[float, float]:
    tokens = sum(r[0] for r in rows)
    seconds = sum(r[1] for r in rows)
    forwards = sum(r[2] for r in rows)
    return tokens / seconds if seconds else 0.0, tokens / forwards if forwards else 0.0


def build_report(
    model_id, device, prompts, max_new_tokens, totals: dict[str, MethodTotals], curve=None
) -> dict:
    """{"model", "device", "prompts", "max_new_tokens", "results": {NAME: {"tok_s", "tau",
    "speedup_vs_hf_ar", "identical_to_ar", "by_task": {TASK: {"tok_s", "tau"}}}}}; ours also
    get "draft_cost" (their decode steps' drafting time / their verify time); with the
    cost `curve`, ours also get "mean_padded_width", "predicted_speedup" (τ / mean relative
    step cost) and "efficiency" (measured speedup over ar / predicted) and "efficiency_vs_hf_ar"
    (the same with the speedup over hf_ar)."""
    reference = totals.get("ar")
    hf_rate = _rate(totals["hf_ar"].by_task.values())[0] if "hf_ar" in totals else None
    ar_rate = _rate(reference.by_task.values())[0] if reference else None
    results = {}
    for name, method in totals.items():
        tok_s, tau = _rate(method.by_task.values())
        results[name] = {
            "tok_s": round(tok_s, 3),
            "tau": round(tau, 3),
            "speedup_vs_hf_ar": round(tok_s / hf_rate, 3) if hf_rate else None,
            "identical_to_ar": (method.outputs == reference.outputs) if reference else None,
            "by_task": {
                task: dict(zip(("tok_s", "tau"), (round(v, 3) for v in _rate([row]))))
                for task, row in method.by_task.items()
            },
        }
        if curve is not None and method.widths:
            results[name].update(_predicted(curve, method.widths, tau))
        if method.accepted_by_source:
            results[name]["accepted_by_source"] = dict(method.accepted_by_source)
        if method.draft_cost is not None:
            results[name]["draft_cost"] = round(method.draft_cost, 4)
    ar_predicted = results.get("ar", {}).get("predicted_speedup")
    for name, r in results.items():
        if "predicted_speedup" in r and ar_predicted:
            r.update(
                _efficiency(r["tok_s"], r["predicted_speedup"], ar_rate, ar_predicted, hf_rate)
            )
    return {
        "model": model_id,
        "device": device,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "results": results,
    }


def _predicted(curve, widths: list[int], tau: float) -> dict:
    """What the cost curve allows: τ / mean relative step cost (padded widths).

    Example: τ 2.0, every step 4 wide at relative cost 1.25 -> predicted 1.6.
    """
    cost = sum(curve.relative(w) for w in widths) / len(widths)
    padded = sum(curve.padded_width(w) for w in widths) / len(widths)
    return {"mean_padded_width": round(padded, 3), "predicted_speedup": round(tau / cost, 3)}


def _efficiency(tok_s, predicted, ar_rate, ar_predicted, hf_rate) -> dict:
    """Measured speedup over ar / the curve's predicted speedup over ar (so ar's is 1.0), and
    over hf_ar / the prediction (hf_ar's step taken as one plain 1-token forward).

    Example: predicted 1.6 (ar 1.0), measured 1.44x ar -> efficiency 0.9.
    """
    out = {"efficiency": round(tok_s / ar_rate / (predicted / ar_predicted), 3)}
    if hf_rate:
        out["efficiency_vs_hf_ar"] = round(tok_s / hf_rate / predicted, 3)
    return out


def check_contract(
    model, prompts: list[BenchPrompt], totals: dict[str, MethodTotals], tolerance, adapter=None
) -> dict:
    """NAME -> the tie check (`engine.ties.check_outputs`) of its outputs against `ar`'s, for
    every method decoding with the served model (hf_ar_fp32 runs another one)."""
    by_id = {p.question_id: p.ids for p in prompts}
    reference = totals["ar"].outputs
    return {
        name: check_outputs(model, by_id, reference, m.outputs, tolerance, adapter).model_dump()
        for name, m in totals.items()
        if name not in ("ar", "hf_ar_fp32")
    }


def format_table(report: dict) -> str:
    tasks = sorted({t for r in report["results"].values() for t in r["by_task"]})
    head = (
        f"{'method':<15}{'tok/s':>8}{'tau':>7}{'vs hf_ar':>10}{'same':>6}{'eff':>6}{'draft':>7}  "
        + " ".join(f"{t[:12]:>12}" for t in tasks)
    )
    lines = [head, "-" * len(head)]
    for name, r in report["results"].items():
        speed = r["speedup_vs_hf_ar"]
        same = {True: "yes", False: "NO", None: "-"}[r["identical_to_ar"]]
        cells = " ".join(
            f"{r['by_task'].get(t, {}).get('tau', 0):>5.2f}/{r['by_task'].get(t, {}).get('tok_s', 0):>6.1f}"
            for t in tasks
        )
        speed_s = f"{speed:.2f}x" if speed is not None else "-"
        if r["identical_to_ar"] is False and "all_ties" in r:
            same = "tie" if r["all_ties"] else "NO"
        eff = f"{r['efficiency']:.2f}" if "efficiency" in r else "-"
        draft = f"{r['draft_cost']:.3f}" if "draft_cost" in r else "-"
        lines.append(
            f"{name:<15}{r['tok_s']:>8.1f}{r['tau']:>7.2f}{speed_s:>10}{same:>6}{eff:>6}"
            f"{draft:>7}  {cells}"
        )
    lines.append("(per task: tau/tok_s; same: identical to ar, tie: differs only at ties; ")
    lines.append(" eff: measured speedup over ar / (tau / relative cost of the padded widths);")
    lines.append(" draft: a decode step's drafting time / its verify time)")
    if "invariance" in report:
        inv = report["invariance"]
        lines.append(f"invariant: {str(inv['invariant']).lower()} ({inv['reason']})")
    return "\n".join(lines)


def plot_report(report: dict, path: Path) -> None:
    import matplotlib  # lazy: matplotlib is optional (the `plot` extra): only --plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after use("Agg"), and optional as above

    names = list(report["results"])
    speed = [report["results"][n]["speedup_vs_hf_ar"] or 0 for n in names]
    taus = [report["results"][n]["tau"] for n in names]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].bar(names, speed, color="tab:blue")
    axes[0].axhline(1.0, color="gray", lw=0.8)
    axes[0].set_title("speedup vs hf_ar (tokens/s ratio)")
    axes[1].bar(names, taus, color="tab:green")
    axes[1].set_title("τ (tokens per target forward)")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(
        f"{report['model']} on {report['device']}, {report['prompts']} prompts, "
        f"{report['max_new_tokens']} new tokens"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
