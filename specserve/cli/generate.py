"""`specserve generate`: stream one completion of the served model (a variant with --adapter),
decoded by one strategy with its config tuned earlier on this device, or given."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specserve.cli.common import add_model_args, from_flags, parse_overrides
from specserve.cli.drafters import drafter_config, load_drafters
from specserve.engine.drafters.specs import KIND_NAMES
from specserve.engine.prompts import encode_prompt


def add_commands(sub: argparse._SubParsersAction) -> None:
    gen = sub.add_parser("generate", help="stream one completion")
    add_model_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--raw", action="store_true", help="no chat template")
    gen.add_argument("--strategy", default="lookahead")
    gen.add_argument("--config", action="append", default=[], help="strategy KEY=VALUE")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=None)
    gen.add_argument("--adapter", type=Path, default=None, help="LoRA adapter directory")
    gen.add_argument(
        "--drafter-dir", type=Path, default=None, help="DIR/<kind>, kinds: " + ", ".join(KIND_NAMES)
    )
    gen.set_defaults(func=cmd_generate)


def cmd_generate(args) -> int:
    from specserve.cli.target import (  # lazy: +3.6 s (torch, transformers)
        compile_forward,
        load_command_target,
    )
    from specserve.engine.decode.engine import Engine  # lazy: +3 s (torch, transformers)
    from specserve.engine.proposers import REGISTRY  # lazy: +3 s (torch, transformers)
    from specserve.engine.sampling import SamplingParams  # lazy: +1 s (torch)
    from specserve.platform.serving import (  # lazy: +3 s (torch, transformers)
        cached_tuning,
        serving_forward,
    )

    params = from_flags(SamplingParams, args, stop=args.stop or [])
    config = parse_overrides(args.config, scoped=False)
    REGISTRY.config(args.strategy, config)  # fail on a bad strategy before loading the model
    kinds = [args.strategy] if args.strategy in KIND_NAMES else []
    if kinds and not args.drafter_dir:
        raise ValueError(f"generate: strategy {args.strategy!r} needs --drafter-dir")
    target = load_command_target(args)
    drafters = load_drafters(args.drafter_dir, target, kinds) if kinds else {}
    compile_forward(args, target.served, features=bool(kinds))
    serving_forward(target.served)
    tuning = cached_tuning(target.served, [args.strategy])  # of the forward as compiled
    tuned_config = tuning.configs.get(args.strategy)
    if kinds and not config and tuning.curve is not None:
        tuned_config = drafter_config(drafters[args.strategy], tuning.curve)
    engine = Engine.from_loaded(target.loaded, tuning.pad_width, drafters)
    ids = encode_prompt(target.loaded.tokenizer, args.prompt, chat=not args.raw)
    state = engine.start(
        ids, params, args.strategy, config or tuned_config or {}, adapter=target.adapter
    )
    for step in engine.stream(state):
        sys.stdout.write(step.text)
        sys.stdout.flush()
    result = engine.result(state)
    print(file=sys.stdout)
    print(
        f"[{args.strategy}] {len(result.output_ids)} tokens in {result.seconds:.2f}s "
        f"({len(result.output_ids) / result.seconds:.1f} tok/s), tau {result.tau:.2f}, "
        f"finish {result.finish_reason}",
        file=sys.stderr,
    )
    return 0
