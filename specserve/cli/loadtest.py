"""`specserve loadtest`: concurrent streaming load on a running server, per mode (ar, spec,
policy) and concurrency level, then optional overload and disconnect phases; a JSON report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specserve.cli.common import cache_dir, device_name, log


def add_commands(sub: argparse._SubParsersAction) -> None:
    lt = sub.add_parser("loadtest", help="concurrent streaming load on a running server, per mode")
    lt.add_argument("--url", default=None, help="default $SPECSERVE_URL or http://127.0.0.1:8000")
    lt.add_argument(
        "--token", default=None, help="admin token (modes force strategies per variant)"
    )
    lt.add_argument("--cache-dir", type=Path, default=None)
    lt.add_argument("--model", default="smollm2-135m")
    lt.add_argument(
        "--variants", type=int, default=4, help="variants load-0..N-1 (registered from --adapter)"
    )
    lt.add_argument("--adapter", type=Path, default=None)
    lt.add_argument("--concurrency", default="1,2,4,8,16")
    lt.add_argument(
        "--requests", type=int, default=16, help="requests per level (at least the concurrency)"
    )
    lt.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="at least this many requests per stream at each level (steady state, less ramp)",
    )
    lt.add_argument("--modes", default="ar,spec,policy")
    lt.add_argument("--max-tokens", type=int, default=64)
    lt.add_argument("--data", type=Path, default=Path("../shared/bench/specbench_dev.jsonl"))
    lt.add_argument("--out", type=Path, default=None)
    lt.add_argument(
        "--plot", type=Path, default=None, help="PNG: throughput and ITL p50 vs concurrency"
    )
    _add_stress_args(lt)
    lt.set_defaults(func=cmd_loadtest)


def _add_stress_args(lt: argparse.ArgumentParser) -> None:
    lt.add_argument(
        "--overload-factor",
        type=float,
        default=0.0,
        help="after the levels, F x capacity clients back to back (policy mode); 0: off",
    )
    lt.add_argument("--overload-seconds", type=float, default=20.0)
    lt.add_argument(
        "--overload-processes",
        type=int,
        default=4,
        help="client processes the overload clients are spread over (1: threads of this one)",
    )
    lt.add_argument(
        "--overload-capacity",
        type=int,
        default=None,
        help="capacity the factor multiplies (default: the highest --concurrency level)",
    )
    lt.add_argument(
        "--disconnect",
        type=int,
        default=0,
        help="then N streams cut abruptly after --disconnect-after tokens; 0: off",
    )
    lt.add_argument("--disconnect-after", type=int, default=3)


def cmd_loadtest(args) -> int:
    import torch  # lazy: +1.4 s (torch)

    from specserve.platform.api.client import AdminClient  # lazy: +7 ms (http.client, ssl)
    from specserve.tools import loadtest  # lazy: +41 ms (76 modules)

    levels = [int(c) for c in args.concurrency.split(",") if c]
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in loadtest.MODES:
            raise ValueError(f"modes: unknown {mode!r}; valid: {', '.join(loadtest.MODES)}")
    capacity = args.overload_capacity or max(levels, default=0)
    if args.overload_factor > 0 and int(args.overload_factor * capacity) < 1:
        raise ValueError("--overload-factor: needs --overload-capacity or --concurrency levels")
    client = AdminClient.from_env(args.url, args.token, cache_dir(args))
    names = [f"load-{i}" for i in range(args.variants)]
    _ensure_variants(args, client, names)
    rows = [row for row in map(json.loads, args.data.read_text().splitlines()) if row.get("turns")]
    prompts = loadtest.interleave_tasks(rows)
    tasks = len({row.get("task") or row.get("category") or "" for row in rows})
    traffic = loadtest.Traffic(  # what every phase sends: the variants (or the base model)
        url=client.url, models=names or [args.model], prompts=prompts, max_tokens=args.max_tokens
    )
    results, engine = _run_modes(args, client, names, traffic, tasks, levels, modes)
    report = {
        "model": args.model,
        "device": device_name(torch.device("cpu")) + f" (server {client.url})",
        "variants": len(names),
        "max_tokens": args.max_tokens,
        "prompts": "Spec-Bench first turns, tasks interleaved; the same sequence in every mode, "
        "none repeated within a mode unless the run needs more than the file holds; "
        + (
            "a fresh version of every variant per mode (empty n-gram pools)"
            if args.adapter
            else "variants as registered"
        ),
        "results": results,
        "engine": engine,
    }
    # policy mode from here on: every variant's strategy is back to the policy's
    _stress(args, traffic, capacity, report)
    if args.plot:
        try:
            loadtest.plot(report, args.plot)
            report["plot"] = str(args.plot)
        except ImportError as err:
            report["plot_error"] = f"--plot needs matplotlib: {err}"
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def _ensure_variants(args, client, names: list[str]) -> None:
    """Register each of `names` not registered yet from --adapter (which it then needs)."""
    known = {v["name"] for v in client.list_variants()["variants"]}
    for name in names:
        if name not in known:
            if args.adapter is None:
                raise ValueError(
                    f"variant {name} is not registered: pass --adapter DIR to register it"
                )
            client.register(name, args.model, str(Path(args.adapter).resolve()), {})


def _run_modes(args, client, names, traffic, tasks, levels, modes) -> tuple[dict, dict]:
    """(mode -> level -> summary, mode -> level -> where the engine loop's time went) of
    `traffic`; every variant's strategy forced per mode, and back to the policy's afterwards."""
    from specserve.tools import loadtest  # lazy: +41 ms (76 modules)

    results: dict[str, dict[str, dict]] = {}
    engine: dict[str, dict[str, dict | None]] = {}
    try:
        for mode in modes:
            if args.adapter is not None:  # a new version per mode: its n-gram pools start empty
                for name in names:
                    client.register(name, args.model, str(Path(args.adapter).resolve()), {})
            for name in names:
                client.call("PUT", f"/variants/{name}/strategy", {"strategy": loadtest.MODES[mode]})
            first = 0  # every mode sees the same prompts; no prompt twice within a mode
            for conc in levels:
                count = loadtest.level_requests(args.requests, args.rounds, conc, tasks)
                before = loadtest.engine_figures(loadtest.fetch(client.url, "/metrics"))
                level = loadtest.run_level(traffic, conc, count, first)
                first += count
                results.setdefault(mode, {})[str(conc)] = summary = loadtest.summarize(level)
                after = loadtest.engine_figures(loadtest.fetch(client.url, "/metrics"))
                share = loadtest.engine_share(before, after, level.seconds)
                engine.setdefault(mode, {})[str(conc)] = share
                log(f"{mode} c={conc}: {summary}; engine loop: {share}")
    finally:
        for name in names:
            client.call("PUT", f"/variants/{name}/strategy", {"strategy": None})
    return results, engine


def _stress(args, traffic, capacity: int, report: dict) -> None:
    """The overload and disconnect phases of `traffic`, when their flags are on, into `report`."""
    from specserve.tools import loadtest  # lazy: +41 ms (76 modules)

    if args.overload_factor > 0:
        clients = int(args.overload_factor * capacity)
        log(f"overload: {clients} clients for {args.overload_seconds} s")
        report["overload"] = loadtest.run_overload(
            traffic, clients, args.overload_seconds, processes=args.overload_processes
        )
        log(f"overload: {report['overload']}")
    if args.disconnect > 0:
        log(f"disconnect: {args.disconnect} streams cut after {args.disconnect_after} tokens")
        report["disconnect"] = loadtest.run_disconnect(
            traffic, args.disconnect, args.disconnect_after
        )
        log(f"disconnect: {report['disconnect']}")
