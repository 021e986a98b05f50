"""`specserve variants register | list | show | delete | train | capture`: the admin API of a running
server, through `AdminClient` (URL and token from flags, the environment or the cache)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specserve.cli.common import cache_dir, log, parse_overrides
from specserve.engine.drafters.specs import KIND_NAMES


def server_args() -> argparse.ArgumentParser:
    """--url, --token and --cache-dir: where the server is and how to authenticate."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", default=None, help="default $SPECSERVE_URL or http://127.0.0.1:8000"
    )
    common.add_argument(
        "--token", default=None, help="default $SPECSERVE_ADMIN_TOKEN or <cache>/admin-token"
    )
    common.add_argument("--cache-dir", type=Path, default=None)
    return common


def add_commands(sub: argparse._SubParsersAction) -> None:
    var = sub.add_parser(
        "variants", help="admin client: register, list, show, delete, train, capture"
    )
    common = server_args()
    var_sub = var.add_subparsers(dest="action", required=True)
    reg = var_sub.add_parser("register", parents=[common])
    reg.add_argument("name")
    reg.add_argument("--base-model", default="smollm2-135m")
    reg.add_argument(
        "--adapter", required=True, help="adapter directory under the server's adapter root"
    )
    reg.add_argument("--hint", action="append", default=[], help="policy hint KEY=VALUE")
    ls = var_sub.add_parser("list", parents=[common], help="variants in name order, paged")
    ls.add_argument("--limit", type=int, default=None, help="at most N (default: every one)")
    ls.add_argument("--after", default=None, help="start after this name (a previous last_id)")
    for action in ("show", "delete"):
        var_sub.add_parser(action, parents=[common]).add_argument("name")
    tr = var_sub.add_parser("train", parents=[common], help="start (or --cancel) drafter training")
    tr.add_argument("name")
    tr.add_argument("--kind", default="eagle", choices=KIND_NAMES)
    tr.add_argument("--budget-minutes", type=float, default=None)
    tr.add_argument("--follow", action="store_true")
    tr.add_argument("--cancel", action="store_true")
    tr.add_argument(
        "--from-traffic",
        action="store_true",
        help="retrain from the variant's captured traffic (replaces the drafter only if better)",
    )
    cap = var_sub.add_parser("capture", parents=[common], help="show or set traffic capture")
    cap.add_argument("name")
    cap.add_argument("--on", dest="enabled", action="store_true", default=None)
    cap.add_argument("--off", dest="enabled", action="store_false")
    cap.add_argument("--max-samples", type=int, default=None)
    cap.add_argument("--retention-s", type=float, default=None)
    var.set_defaults(func=cmd_variants)


def cmd_variants(args) -> int:
    from specserve.platform.api.client import AdminClient  # lazy: +7 ms (http.client, ssl)

    client = AdminClient.from_env(args.url, args.token, cache_dir(args))
    if args.action == "register":
        out = client.register(
            args.name,
            args.base_model,
            str(Path(args.adapter).resolve()),
            parse_overrides(args.hint, scoped=False),
        )
    elif args.action == "list":
        out = client.list_variants(args.limit, args.after)
    elif args.action == "show":
        out = client.call("GET", f"/variants/{args.name}")
    elif args.action == "delete":
        out = client.call("DELETE", f"/variants/{args.name}")
    elif args.action == "capture":
        fields = {"enabled": args.enabled, "max_samples": args.max_samples}
        fields["retention_s"] = args.retention_s
        body = {k: v for k, v in fields.items() if v is not None}
        path = f"/variants/{args.name}/capture"
        out = client.call("PUT", path, body) if body else client.call("GET", path)
    elif args.cancel:
        out = client.call("DELETE", f"/variants/{args.name}/drafters/{args.kind}")
    else:
        body = {"kind": args.kind, "from_traffic": args.from_traffic} | (
            {"budget_minutes": args.budget_minutes} if args.budget_minutes else {}
        )
        out = client.call("POST", f"/variants/{args.name}/drafters", body)
        if args.follow:
            out = client.follow(args.name, args.kind, log=log)
    print(json.dumps(out, indent=1))
    return 0
