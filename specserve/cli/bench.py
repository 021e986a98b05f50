"""`specserve bench`: every strategy and the transformers baselines on Spec-Bench prompts, each
checked against ar (lossless, or a divergence within the measured tie tolerance); a JSON report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specserve.cli.common import device_name, log, parse_overrides
from specserve.cli.drafters import drafter_config, load_drafters
from specserve.cli.tune import add_tuning_args, tuned_methods
from specserve.engine.drafters.specs import KIND_NAMES


def add_commands(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="benchmark against transformers")
    add_tuning_args(b)
    b.add_argument("--data", type=Path, default=Path("../shared/bench/specbench_dev.jsonl"))
    b.add_argument("--per-task", type=int, default=3)
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--baselines", default="hf_ar,hf_pld")
    b.add_argument("--out", type=Path, default=None)
    b.add_argument("--plot", type=Path, default=None)
    b.add_argument(
        "--pool",
        choices=("fresh", "warm"),
        default="fresh",
        help="n-gram pool per method: fresh for every prompt, or warm (one across the prompts, "
        "as a served variant's pool outlives its requests)",
    )
    b.add_argument(
        "--drafter-dir", type=Path, default=None, help="DIR/<kind>, kinds: " + ", ".join(KIND_NAMES)
    )
    b.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from specserve.cli.target import (  # lazy: +3.6 s (torch, transformers)
        compile_forward,
        load_command_target,
    )
    from specserve.tools import bench  # lazy: +4.5 s (torch, transformers)

    names, baselines = _checked_methods(args)
    drafter_kinds = [n for n in names if n in KIND_NAMES]
    if drafter_kinds and not args.drafter_dir:
        raise ValueError(f"bench: {', '.join(drafter_kinds)} need --drafter-dir")
    target = load_command_target(args)
    loaded = target.loaded
    drafters = load_drafters(args.drafter_dir, target, drafter_kinds)
    compile_record = compile_forward(args, target.served, features=bool(drafter_kinds))
    engine, methods, choices, curve = tuned_methods(
        args, target.served, [n for n in names if n not in drafter_kinds]
    )
    engine.drafters = drafters
    _size_drafters(args, drafters, curve, methods, choices)
    methods.update({b: None for b in baselines})
    fp32 = _fp32_copy(args, loaded) if "hf_ar_fp32" in baselines else None
    prompts = bench.load_specbench(args.data, args.per_task, loaded.tokenizer)
    log(f"benchmarking {len(prompts)} prompts x {len(methods)} methods ...")
    totals = bench.run_bench(
        engine,
        prompts,
        methods,
        args.max_new_tokens,
        log,
        target.adapter,
        fp32,
        pools=bench.warm_pools(methods) if args.pool == "warm" else None,
    )
    report = bench.build_report(
        loaded.model_id, device_name(loaded.device), prompts, args.max_new_tokens, totals, curve
    )
    report["pool"] = args.pool
    report["dtype"] = str(loaded.dtype)
    report["dtype_choice"] = (
        loaded.dtype_choice.model_dump()
        if loaded.dtype_choice is not None
        else {"chosen": str(loaded.dtype), "reason": f"--dtype {args.dtype}"}
    )
    report["compile"] = compile_record
    report["invariance"] = engine.invariance.model_dump()  # invariant: one output per prefix
    if "ar" in totals:
        _check_contract(report, target, prompts, totals)
    report["cost_curve_ms"] = curve.ms
    report["strategy_configs"] = {n: c for n, c in methods.items() if c is not None}
    report["tuning"] = choices
    if drafters:
        report["drafters"] = {k: d.manifest.model_dump(mode="json") for k, d in drafters.items()}
    if target.adapter:
        adapter = {"path": str(Path(args.adapter).resolve()), "sha256": target.adapter_sha256}
        report["adapter"] = adapter
    _write(args, report)
    return 0


def _checked_methods(args) -> tuple[list[str], list[str]]:
    """(strategies, baselines) of the flags; unknown names fail before the model loads."""
    from specserve.engine.proposers import REGISTRY  # lazy: +3 s (torch, transformers)
    from specserve.tools import bench  # lazy: +4.5 s (torch, transformers)

    names = [s for s in args.strategies.split(",") if s]
    baselines = [b for b in args.baselines.split(",") if b]
    for name in names:
        REGISTRY.get(name)
    for b in baselines:
        if b not in bench.BASELINES:
            raise ValueError(f"baselines: unknown {b!r}; valid: {', '.join(bench.BASELINES)}")
    return names, baselines


def _size_drafters(args, drafters: dict, curve, methods: dict, choices: dict) -> None:
    """Each drafter's config: from --config, else its tree sized to the device cost curve."""
    overrides = parse_overrides(args.config, scoped=True)
    for kind, drafter in drafters.items():
        info: dict = {"chosen_from": "device cost curve"}
        methods[kind] = overrides.get(kind) or drafter_config(drafter, curve, info)
        choices[kind] = {"config": methods[kind], **info}
        log(f"  {kind}: {methods[kind]} ({info})")


def _check_contract(report: dict, target, prompts, totals) -> None:
    """Every divergence from ar checked by plain forwards over the common prefix: a tie within
    the tolerance measured on calibration text, or a broken contract."""
    from specserve.engine.ties import (  # lazy: +3 s (torch, transformers)
        measure_tolerance,
        tolerance_sequences,
    )
    from specserve.tools import bench  # lazy: +4.5 s (torch, transformers)

    log("checking every divergence from ar (plain forwards over the common prefix) ...")
    model, tokenizer = target.loaded.model, target.loaded.tokenizer
    sequences = tolerance_sequences(tokenizer, model.config.vocab_size)
    tolerance = measure_tolerance(model, sequences, adapter=target.adapter).model_dump()
    report["tie_tolerance"] = tolerance
    checks = bench.check_contract(model, prompts, totals, tolerance["tolerance"], target.adapter)
    for name, check in checks.items():
        report["results"][name].update(
            {k: check[k] for k in ("divergences", "max_tie_gap", "all_ties")}
        )


def _fp32_copy(args, loaded):
    """The served model in float32 (the same object when it already is), with the same adapter."""
    import torch  # lazy: +1.4 s (torch)

    from specserve.cli.target import load_command_target  # lazy: +3.6 s (torch, transformers)

    if loaded.dtype == torch.float32:
        return loaded.model
    log("loading a float32 copy for hf_ar_fp32 ...")
    return load_command_target(args, dtype="float32").loaded.model


def _write(args, report: dict) -> None:
    from specserve.tools import bench  # lazy: +4.5 s (torch, transformers)

    print(bench.format_table(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
        log(f"wrote {args.out}")
    if args.plot:
        bench.plot_report(report, Path(args.plot))
        log(f"wrote {args.plot}")
