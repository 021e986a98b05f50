"""`specserve tune`: measure the device cost curve and pick each strategy's draft sizes on
calibration prompts (cached per model, device and dtype); `tuned_methods` is shared with bench."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specserve.cli.common import add_model_args, log, parse_overrides
from specserve.engine.prompts import calibration_prompts, encode_prompt


def add_tuning_args(p: argparse.ArgumentParser) -> None:
    """The flags tune and bench share."""
    add_model_args(p)
    p.add_argument("--strategies", default="ar,prompt_lookup,lookahead")
    p.add_argument("--retune", action="store_true", help="remeasure cost curve and retune")
    p.add_argument("--no-tune", action="store_true", help="use default strategy configs")
    p.add_argument("--config", action="append", default=[], help="STRATEGY.KEY=VALUE")
    p.add_argument("--adapter", type=Path, default=None, help="LoRA adapter directory")


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="measure the cost curve, pick draft sizes")
    add_tuning_args(p)
    p.set_defaults(func=cmd_tune)


def tuned_methods(args, served, strategies: list[str]):
    """(engine padding to the device's cheapest widths, strategy -> config, strategy -> tuning
    record, cost curve): configs tuned from the curve unless overridden on the command line."""
    from specserve.engine.decode.engine import Engine  # lazy: +3 s (torch, transformers)
    from specserve.engine.tuning.cost import load_or_measure  # lazy: +3 s (torch, transformers)
    from specserve.engine.tuning.drafts import (  # lazy: +3 s (torch, transformers)
        load_or_tune,
        with_cost,
    )
    from specserve.platform.serving import serving_forward  # lazy: +3 s (torch, transformers)

    loaded = served.loaded
    overrides = parse_overrides(getattr(args, "config", []), scoped=True)
    report = serving_forward(served)  # the curve of the forward the engine serves
    log(f"invariant forward: {report.invariant} ({report.reason})")
    log("measuring / loading the device cost curve ...")
    curve = load_or_measure(loaded.model, loaded.model_id, served.cache_dir, remeasure=args.retune)
    log(
        "cost of a k-token verify forward (ms): "
        + ", ".join(f"{k}: {v:.1f}" for k, v in sorted(curve.ms.items()))
    )
    engine = Engine.from_loaded(loaded, curve.padded_width)
    prompts = [encode_prompt(loaded.tokenizer, p) for p in calibration_prompts()]
    methods, choices = {}, {}
    for name in strategies:
        if name in overrides or args.no_tune or name == "ar":
            # the default config still sizes its drafts by the measured curve (hybrid's budget)
            methods[name] = with_cost(name, overrides.get(name, {}), curve)
            continue
        log(f"tuning {name} on calibration prompts (cached after the first run) ...")
        tuned = load_or_tune(engine, name, curve, prompts, served.cache_dir, args.retune, log)
        methods[name] = tuned.config
        choices[name] = tuned.model_dump()
        best = tuned.best
        log(
            f"  {name}: {tuned.config} (calibration tau {best.tau:.2f}, width "
            f"{best.mean_width:.1f}, step cost {best.mean_cost:.2f}x, predicted "
            f"{best.predicted_speedup:.2f}x over ar)"
        )
    return engine, methods, choices, curve


def cmd_tune(args) -> int:
    from specserve.cli.target import (  # lazy: +3.6 s (torch, transformers)
        compile_forward,
        load_command_target,
    )
    from specserve.engine.lora.batch import lora_rows  # lazy: +1.2 s (torch)

    target = load_command_target(args)
    loaded = target.loaded
    compile_record = compile_forward(args, target.served)
    with lora_rows(loaded.model, [target.adapter]):  # the variant is what gets tuned
        _, _, choices, curve = tuned_methods(args, target.served, args.strategies.split(","))
    choice = loaded.dtype_choice.model_dump() if loaded.dtype_choice is not None else None
    out = {"dtype": str(loaded.dtype), "dtype_choice": choice, "compile": compile_record}
    out["cost_curve_ms"] = curve.ms
    print(json.dumps(out | {"choices": choices}, indent=1))
    return 0
