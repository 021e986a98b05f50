"""`specserve train-drafter` (Medusa heads or an EAGLE layer for the served model or a variant;
`--from-traffic VARIANT`: a running server retrains the variant's drafter from its captured
traffic, through the admin API) and `specserve finetune` (a LoRA adapter, a new variant, from a
.txt/.jsonl file)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specserve.adapters.fingerprint import adapter_sha256
from specserve.adapters.settings import AdapterLimits
from specserve.cli.common import (
    add_model_args,
    cache_dir,
    from_flags,
    log,
    nested_overrides,
    parse_overrides,
)
from specserve.engine.drafters.specs import KIND_NAMES
from specserve.files import file_sha256


def add_commands(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train-drafter", help="train Medusa heads or an EAGLE layer")
    add_model_args(t)
    t.add_argument("--adapter", type=Path, default=None, help="LoRA adapter directory")
    t.add_argument("--kind", required=True, choices=KIND_NAMES)
    t.add_argument(
        "--out", type=Path, default=None, help="artifact directory (not with --from-traffic)"
    )
    t.add_argument("--budget-minutes", type=float, default=20.0)
    t.add_argument(
        "--data",
        type=Path,
        action="append",
        default=[],
        help="the variant's own .txt/.jsonl data, added to the shipped corpus (repeatable)",
    )
    t.add_argument(
        "--from-traffic",
        metavar="VARIANT",
        default=None,
        help="retrain VARIANT's drafter on a running server from its captured traffic; the new "
        "one replaces the current one only if it beats it on held-out recent traffic",
    )
    t.add_argument(
        "--config",
        action="append",
        default=[],
        help="dotted KEY=VALUE of the training settings (eagle.feature_layers=[3,15,-1], "
        "trainer.lr=0.002, draft_vocab=4096, ...)",
    )
    t.add_argument("--min-gain", type=float, default=0.0, help="with --from-traffic: tau to gain")
    t.add_argument("--url", default=None, help="with --from-traffic: default $SPECSERVE_URL")
    t.add_argument("--token", default=None, help="with --from-traffic: the admin token")
    t.set_defaults(func=cmd_train_drafter)

    ft = sub.add_parser("finetune", help="train a LoRA adapter (a variant) on a .txt/.jsonl file")
    add_model_args(ft)
    ft.add_argument(
        "--data",
        type=Path,
        required=True,
        help=".txt, or .jsonl of text/prompt+completion/messages",
    )
    ft.add_argument("--out", type=Path, required=True, help="adapter directory to write")
    ft.add_argument("--budget-minutes", type=float, default=None, help="time budget (default 10)")
    ft.add_argument(
        "--config", action="append", default=[], help="KEY=VALUE (rank, learning_rate, ...)"
    )
    ft.set_defaults(func=cmd_finetune)


def cmd_train_drafter(args) -> int:
    if args.from_traffic is not None:
        return retrain_from_traffic(args)
    if args.out is None:
        raise ValueError("train-drafter: --out is required (or --from-traffic VARIANT)")
    from tqdm import tqdm  # lazy: +10 ms, only this command draws bars

    from specserve.cli.target import load_command_target  # lazy: +3.6 s (torch, transformers)
    from specserve.training.corpus import CorpusSettings  # lazy: +3.5 s (torch, peft)
    from specserve.training.run import train_drafter  # lazy: +7.8 s (torch, peft)
    from specserve.training.settings import DrafterTrainSettings  # lazy: +3.5 s (torch, peft)

    overrides = nested_overrides(args.config, DrafterTrainSettings)
    corpus = CorpusSettings(
        **overrides.pop("corpus", {}) | ({"files": args.data} if args.data else {})
    )
    settings = from_flags(DrafterTrainSettings, args, corpus=corpus, **overrides)
    target = load_command_target(args)
    loaded = target.loaded
    drafter = train_drafter(
        loaded.model,
        loaded.tokenizer,
        loaded.model_id,
        loaded.eos_token_ids,
        args.out,
        settings,
        adapter_sha256=target.adapter_sha256,
        data_dir=target.served.cache_dir / "teacher",
        log=log,
        progress_bar=lambda total, desc: tqdm(total=total, desc=desc, file=sys.stderr),
        adapter=target.adapter,
    )
    print(drafter.manifest.model_dump_json(indent=1))
    return 0


def retrain_from_traffic(args) -> int:
    """Ask the server to retrain, follow it, print the drafter's status (the decision, its
    figures and reason are its last `retrains` entry)."""
    from specserve.platform.api.client import AdminClient  # lazy: +7 ms (http.client, ssl)

    client = AdminClient.from_env(args.url, args.token, cache_dir(args))
    name = args.from_traffic
    body = {"kind": args.kind, "from_traffic": True, "min_gain": args.min_gain}
    body |= {"budget_minutes": args.budget_minutes}
    started = client.call("POST", f"/variants/{name}/drafters", body)["retrains"][-1]
    status = client.follow_retrain(name, args.kind, started["started_at"], log=log)
    last = status["retrains"][-1]
    log(f"{args.kind} retrain of {name}: {last['state']}: {last['reason']}")
    print(json.dumps(status, indent=1))
    return 0 if last["state"] in ("replaced", "kept") else 1


def cmd_finetune(args) -> int:
    from specserve.adapters.resident import base_model_names  # lazy: +1 s (torch)
    from specserve.adapters.validate import BaseModelSpec, validate_adapter  # lazy: +1.3 s (torch)
    from specserve.cli.target import load_command_target  # lazy: +3.6 s (torch, transformers)
    from specserve.training.finetune import (  # lazy: +5.4 s (torch, peft)
        FinetuneConfig,
        finetune,
        load_examples,
    )

    overrides = parse_overrides(args.config, scoped=False)
    if args.budget_minutes is not None:
        overrides["budget_minutes"] = args.budget_minutes
    config = FinetuneConfig.model_validate(overrides)
    if not args.data.is_file():
        raise ValueError(f"data: {args.data} is not a file")
    loaded = load_command_target(args).loaded
    names = base_model_names(loaded.model_id)
    spec = BaseModelSpec.of(loaded.model, names)  # before peft wraps the model
    eos_id = min(loaded.eos_token_ids)
    examples = load_examples(args.data, loaded.tokenizer, eos_id, config.block_size)
    data_desc = {
        "path": str(args.data),
        "sha256": file_sha256(args.data),
        "examples": len(examples),
    }
    log(
        f"fine-tuning {loaded.model_id} on {len(examples)} examples for at most "
        f"{config.budget_minutes} min"
    )
    record = finetune(
        loaded.model, loaded.tokenizer, examples, config, args.out, loaded.model_id, data_desc
    )
    out = args.out.resolve()
    checked = validate_adapter(
        out, spec, AdapterLimits(root=out.parent, max_rank=max(64, config.rank))
    )
    log(
        f"held-out loss before/after: {record['held_out_loss_before_after']}; {record['steps']} steps"
    )
    print(
        json.dumps(
            {"adapter": str(out), "sha256": adapter_sha256(out), "rank": checked.rank, **record},
            indent=1,
        )
    )
    return 0
