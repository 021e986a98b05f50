"""Where the compiled forward's start goes: warm it once and print the record and dynamo's phases.

    python scripts/compile_profile.py --dtype bfloat16 [--features] [--inductor-cache DIR]

Run it twice with the same `--inductor-cache` to see a first start and a warm one. Prints the
`CompileRecord` (eager vs compiled ms per width, start seconds, graphs, on-disk cache hits) and
the cumulative seconds of dynamo's main phases (tracing, AOT autograd, inductor codegen, C++
compile, cache loads).
"""

from __future__ import annotations

import argparse
import os

PHASES = (
    "_compile.compile_inner",
    "bytecode_tracing",
    "create_aot_dispatcher_function",
    "aot_collect_metadata",
    "compile_fx_inner",
    "GraphLowering.codegen",
    "compile_file",
    "AOTAutogradCache.inductor_load",
    "PyCodeCache.load_by_key_path",
    "build_guards",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--features", action="store_true", help="also warm the hidden-feature shapes")
    ap.add_argument("--inductor-cache", default=None, help="TORCHINDUCTOR_CACHE_DIR for this run")
    args = ap.parse_args()
    if args.inductor_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.inductor_cache

    from torch._dynamo.utils import compile_times

    from specserve.engine.forward import compiled
    from specserve.models.load import load_model

    loaded = load_model(args.model, dtype=args.dtype)
    settings = compiled.CompileSettings(features=args.features)
    record = compiled.attach(loaded.model, settings).warm(loaded.model_id)
    print(record.model_dump_json(indent=1))
    times = compile_times(repr="csv", aggregate=True)  # (names, seconds)
    by_name = dict(zip(times[0], times[1], strict=False))
    for name in PHASES:
        if name in by_name:
            print(f"{name:36s} {float(by_name[name]):8.1f} s")


if __name__ == "__main__":
    main()
