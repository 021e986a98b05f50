"""`specserve faults`: the fault suite (specserve/tools/faults) against its own loopback
`specserve up` (or --url, one running with SPECSERVE_FAULT_INJECTION=1); a table on stdout, the
JSON report at --out, a Markdown table at --markdown."""

from __future__ import annotations

import argparse
from pathlib import Path

from specserve.cli.common import from_flags, log
from specserve.paths import config_file


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("faults", help="fault suite: break parts of a running platform, report")
    p.add_argument("--url", default=None, help="a running server (default: start one here)")
    p.add_argument("--token", default=None, help="admin token (--url; default as `variants`)")
    p.add_argument("--config", type=Path, default=None, help="default: the packaged serve.yaml")
    p.add_argument("--cache-dir", type=Path, default=None, help="default: a temporary one")
    p.add_argument("--model", default=None, help="base model (default: the config's first)")
    p.add_argument("--scenarios", default=None, help="comma-separated (default: all)")
    p.add_argument("--streams", type=int, default=8, help="streams in flight at a fault")
    p.add_argument("--after", type=int, default=4, help="requests sent just after a kill")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--deadline-s", type=float, default=120.0, help="a request past it is hung")
    p.add_argument("--window-s", type=float, default=8.0, help="load kept up after a fault")
    p.add_argument("--recover-limit-s", type=float, default=120.0)
    p.add_argument(
        "--engine-stall-s",
        type=float,
        default=20.0,
        help="set in the up's config (short enough to measure; 5 s trips on 2 loaded cores)",
    )
    p.add_argument("--capacity", type=int, default=None, help="overload_3x (default: config)")
    p.add_argument("--adapter", type=Path, default=None, help="version_bump's LoRA adapter")
    p.add_argument("--adapter-root", type=Path, default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--start-timeout-s", type=float, default=600.0, help="until up answers")
    p.add_argument("--out", type=Path, default=None, help="the JSON report")
    p.add_argument("--markdown", type=Path, default=None, help="the table as Markdown")
    p.set_defaults(func=cmd_faults)


def settings_of(args):
    """The suite's RunSettings from the parsed flags."""
    from specserve.tools.faults import SCENARIOS, RunSettings  # lazy: +0.4 s (redis)
    from specserve.tools.faults.context import SuiteSettings  # lazy: +0.2 s (redis)

    config = args.config or (None if args.url else config_file("serve.yaml"))
    names = [n for n in (args.scenarios or ",".join(SCENARIOS)).split(",") if n]
    suite = from_flags(SuiteSettings, args)
    return from_flags(RunSettings, args, scenarios=names, config=config, suite=suite)


def cmd_faults(args) -> int:
    from specserve.tools import faults  # lazy: +0.4 s (redis)

    def save(suite) -> None:
        if args.out:
            Path(args.out).write_text(suite.model_dump_json(indent=1))

    suite = faults.run_suite(settings_of(args), log=log, on_report=save)
    save(suite)
    if args.markdown:
        Path(args.markdown).write_text(faults.markdown(suite))
    print(faults.table(suite))
    return 0 if all(r.ok or r.skipped for r in suite.reports) else 1
