"""`specserve up`: the whole platform on this machine (store, local Ray, the Serve application
on one port) until interrupted."""

from __future__ import annotations

import argparse
from pathlib import Path

from specserve.cli.common import cache_dir, log
from specserve.paths import config_file


def add_commands(sub: argparse._SubParsersAction) -> None:
    upp = sub.add_parser(
        "up", help="run the platform here: store, local Ray, Serve app on one port"
    )
    upp.add_argument("--config", type=Path, default=config_file("serve.yaml"))
    upp.add_argument(
        "--host",
        default="127.0.0.1",
        help="where the HTTP gateway listens (default 127.0.0.1). A loopback host also keeps "
        "every Ray and Serve listener (GCS, raylet, workers, agents, replicas) on 127.0.0.1; "
        "any other (0.0.0.0) leaves Ray's on all interfaces, as Ray does by default",
    )
    upp.add_argument("--port", type=int, default=8000)
    upp.add_argument("--num-cpus", type=int, default=None, help="CPUs Ray may use (default: all)")
    upp.add_argument("--cache-dir", type=Path, default=None)
    upp.add_argument(
        "--store",
        choices=["redis", "memory"],
        default=None,
        help="redis: REDIS_URL, else a private redis-server with its AOF under the cache (none "
        "found: an error saying how to get one); memory: an in-cluster store that keeps nothing, "
        "a test and dev aid (default: the config's `store` arg, redis)",
    )
    upp.set_defaults(func=cmd_up)


def cmd_up(args) -> int:
    from specserve.platform.rayserve.up import up  # lazy: +9 ms (yaml)

    return up(
        args.config,
        args.host,
        args.port,
        cache_dir(args),
        args.num_cpus,
        log=log,
        store=args.store,
    )
