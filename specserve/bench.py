"""`specserve bench`: our strategies against transformers `generate()` on Spec-Bench prompts.

Every method decodes the same chat-templated prompts greedily, interleaved prompt by prompt so
machine noise hits all alike; the report gives tokens/s, τ, speedup over `hf_ar` and whether the
token ids equal our `ar` (the JSON contract is in `build_report`).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specserve.engine.decode import Engine
from specserve.engine.lora import adapter_kwargs, is_peft_model
from specserve.engine.prompts import encode_prompt
from specserve.engine.sampling import SamplingParams

BASELINES = ("hf_ar", "hf_pld")


@dataclass(frozen=True)
class BenchPrompt:
    task: str
    question_id: int
    ids: list[int]


@dataclass
class MethodTotals:
    outputs: dict[int, list[int]] = field(default_factory=dict)  # question_id -> output ids
    by_task: dict[str, list[float]] = field(default_factory=dict)  # task -> [tokens, s, forwards]

    def add(self, prompt: BenchPrompt, output: list[int], seconds: float, forwards: int) -> None:
        self.outputs[prompt.question_id] = output
        row = self.by_task.setdefault(prompt.task, [0, 0.0, 0])
        row[0] += len(output)
        row[1] += seconds
        row[2] += forwards


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
    """Greedy `generate()` (through peft with `adapter`); with `pld`, prompt lookup of 10 tokens.
    Returns (output ids, forwards)."""
    counter = ForwardCounter(model.get_base_model() if is_peft_model(model) else model)
    extra = {"prompt_lookup_num_tokens": 10} if pld else {}
    extra.update(adapter_kwargs(model, [adapter]))
    try:
        with torch.inference_mode():
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


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_method(engine: Engine, name: str, config: dict | None, ids, max_new_tokens, adapter=None):
    """One greedy decode (with LoRA `adapter` if given); returns (output ids, seconds, forwards)."""
    _sync(engine.model.device)
    start = time.perf_counter()
    if name in BASELINES:
        output, forwards = run_hf(
            engine.model, ids, max_new_tokens, engine.eos_ids, pld=name == "hf_pld", adapter=adapter
        )
    else:
        params = SamplingParams(max_new_tokens=max_new_tokens)
        result = engine.generate(ids, params, name, config, adapter=adapter)
        output, forwards = result.output_ids, result.forwards
    _sync(engine.model.device)
    return output, time.perf_counter() - start, forwards


def run_bench(
    engine: Engine,
    prompts: list[BenchPrompt],
    methods: dict[str, dict | None],
    max_new_tokens: int,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
    adapter: str | None = None,
) -> dict[str, MethodTotals]:
    """Decode every prompt with every method (after one warm-up each), base + `adapter` if given."""
    for name, config in methods.items():
        run_method(engine, name, config, prompts[0].ids, 4, adapter)
    totals = {name: MethodTotals() for name in methods}
    for i, prompt in enumerate(prompts, 1):
        line = []
        for name, config in methods.items():
            output, seconds, forwards = run_method(
                engine, name, config, prompt.ids, max_new_tokens, adapter
            )
            totals[name].add(prompt, output, seconds, forwards)
            line.append(f"{name} {len(output) / seconds:.1f} tok/s τ {len(output) / forwards:.2f}")
        log(f"[{i}/{len(prompts)}] {prompt.task}#{prompt.question_id}: " + " | ".join(line))
    return totals


def _rate(rows) -> tuple[float, float]:
    tokens = sum(r[0] for r in rows)
    seconds = sum(r[1] for r in rows)
    forwards = sum(r[2] for r in rows)
    return tokens / seconds if seconds else 0.0, tokens / forwards if forwards else 0.0


def build_report(
    model_id, device, prompts, max_new_tokens, totals: dict[str, MethodTotals]
) -> dict:
    """{"model", "device", "prompts", "max_new_tokens", "results": {NAME: {"tok_s", "tau",
    "speedup_vs_hf_ar", "identical_to_ar", "by_task": {TASK: {"tok_s", "tau"}}}}}"""
    reference = totals.get("ar")
    hf_rate = _rate(totals["hf_ar"].by_task.values())[0] if "hf_ar" in totals else None
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
    return {
        "model": model_id,
        "device": device,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "results": results,
    }


def format_table(report: dict) -> str:
    tasks = sorted({t for r in report["results"].values() for t in r["by_task"]})
    head = f"{'method':<15}{'tok/s':>8}{'tau':>7}{'vs hf_ar':>10}{'same':>6}  " + " ".join(
        f"{t[:12]:>12}" for t in tasks
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
        lines.append(f"{name:<15}{r['tok_s']:>8.1f}{r['tau']:>7.2f}{speed_s:>10}{same:>6}  {cells}")
    lines.append("(per task: tau/tok_s)")
    return "\n".join(lines)


def plot_report(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
