"""`specserve drain`: drain a running platform's gateways (all, or this node's: a k8s preStop hook)
and wait until their in-flight requests finish or the timeout passes; then stop it as usual."""

from __future__ import annotations

import argparse

from specserve.cli.common import log


def add_commands(sub: argparse._SubParsersAction) -> None:
    drain = sub.add_parser(
        "drain",
        help="stop admission on a running platform and wait for its in-flight requests",
    )
    drain.add_argument("--address", default="auto", help="the Ray cluster (default: this node's)")
    drain.add_argument(
        "--this-node",
        action="store_true",
        help="only the gateways on this Ray node (a pod's preStop hook), not the whole cluster",
    )
    drain.add_argument(
        "--timeout", type=float, default=30.0, help="seconds in-flight requests get (then cut)"
    )
    drain.set_defaults(func=cmd_drain)


def cmd_drain(args) -> int:
    import ray  # lazy: +0.35 s (ray)

    from specserve.platform.rayserve.drain import EVERY_NODE, drain_platform  # lazy: +0.22 s (ray)

    ray.init(address=args.address, log_to_driver=False)
    try:
        scope = ray.get_runtime_context().get_node_id() if args.this_node else EVERY_NODE
        outcome = drain_platform(args.timeout, log, scope=scope)
        print(outcome.model_dump_json())
    finally:
        ray.shutdown()
    return 0
