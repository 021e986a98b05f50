"""The `specserve` command line: models, generate, tune, bench and train-drafter."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from specserve.paths import config_file


def _parse_value(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_overrides(items: list[str], scoped: bool) -> dict:
    """["window=5"] -> {"window": 5}; scoped: ["lookahead.window=5"] -> {"lookahead": {"window": 5}}."""
    out: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"config: expected KEY=VALUE, got {item!r}")
        if scoped:
            strategy, dot, field = key.partition(".")
            if not dot:
                raise ValueError(f"config: expected STRATEGY.KEY=VALUE, got {item!r}")
            out.setdefault(strategy, {})[field] = _parse_value(value)
        else:
            out[key] = _parse_value(value)
    return out


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="catalog name, HF dir or .gguf file")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if present)")
    p.add_argument(
        "--dtype",
        default="auto",
        help="auto (cheapest request measured on this device, cached) / float32 (exact) / bfloat16",
    )
    p.add_argument("--cache-dir", type=Path, default=None, help="default $SPECSERVE_CACHE")
    p.add_argument(
        "--logits",
        default="model",
        choices=["model", "float32"],
        help="float32: the LM head in float32 over a bf16 model's hidden states",
    )
    p.add_argument(
        "--compile",
        default="auto",
        choices=["auto", "on", "off"],
        help="torch.compile the single-request verify forward (auto: when a cached measurement "
        "here shows it >= 1.05x cheaper, and bit-exact in float32; `tune --compile on` measures)",
    )
    p.add_argument(
        "--compile-mode",
        default="default",
        choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
        help="torch.compile mode when compiling (reduce-overhead: CUDA-graph replay on a GPU)",
    )


def _load(args):
    from specserve.models.load import load_model

    loaded = load_model(args.model, device=args.device, dtype=args.dtype, cache_dir=args.cache_dir)
    if loaded.dtype_choice is not None:
        _log(f"dtype {loaded.dtype_choice.chosen} (auto: {loaded.dtype_choice.reason})")
    if getattr(args, "logits", "model") == "float32":
        from specserve.engine.head import use_float32_head

        if use_float32_head(loaded.model):
            _log("logits: the LM head runs in float32")
    return loaded


def _compile(args, loaded, features: bool = False):
    """Compile the target's verify forward when `--compile` decides so (warming it now, with the
    measurement cached for `auto`); returns the bench/tune record of what was decided."""
    from specserve.engine import compile_choice, compiled
    from specserve.engine.lora_batch import takes_adapters

    mode = getattr(args, "compile", "off")
    cache_dir = _cache_dir(args)
    record = compile_choice.cached_record(cache_dir, loaded.model_id, loaded.device, loaded.dtype)
    decision = compile_choice.decide(mode, record, loaded.dtype)
    if decision.enabled and takes_adapters(loaded.model) and mode == "auto":
        decision = compile_choice.CompileDecision(
            enabled=False, reason="auto: a model with a LoRA adapter stays eager"
        )
    _log(f"compile {'on' if decision.enabled else 'off'} ({decision.reason})")
    if not decision.enabled:
        return {"enabled": False, "reason": decision.reason}
    # compiled graphs persist beside the other caches, so only the first start pays inductor
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir / "inductor"))
    settings = compiled.CompileSettings(
        features=features, inductor_mode=getattr(args, "compile_mode", "default")
    )
    target = compiled.attach(loaded.model, settings)
    last = f" (last time {record.start_s:.0f} s)" if record is not None else ""
    _log(f"compiling the verify forward{last}; this can take minutes on a CPU ...")
    record = target.warm(loaded.model_id)
    compile_choice.save_record(cache_dir, record)
    _log(
        f"compiled in {record.start_s:.0f} s; ms per forward eager -> compiled: "
        + ", ".join(
            f"{k}: {record.eager_ms[k]:.1f} -> {v:.1f}" for k, v in record.compiled_ms.items()
        )
        + f"; max |logit diff| vs eager {record.max_abs_diff:.3g}; {record.graphs} graphs, "
        f"on-disk caches {record.cache_hits}"
    )
    return {"enabled": True, "reason": decision.reason, "record": record.model_dump()}


def _cache_dir(args) -> Path:
    from specserve.models.load import default_cache_dir

    return args.cache_dir or default_cache_dir()


def cmd_models(args) -> int:
    from specserve.models.load import load_catalog, pull_model

    if args.action == "list":
        for name, entry in load_catalog().items():
            print(f"{name}: {entry.description}")
        return 0
    path = pull_model(args.name, args.cache_dir, progress=lambda m: print(m, file=sys.stderr))
    print(path)
    return 0


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _cached_tuning(args, loaded, strategy: str):
    """(cost curve, tuned config), each None when absent, from an earlier `tune`/`bench`."""
    from specserve.engine.compiled import forward_key
    from specserve.engine.tuning import cached_choices

    curve, configs = cached_choices(
        _cache_dir(args), loaded.model_id, loaded.device, forward_key(loaded.model), [strategy]
    )
    return curve, configs.get(strategy)


def cmd_generate(args) -> int:
    from specserve.engine.decode import Engine
    from specserve.engine.prompts import encode_prompt
    from specserve.engine.proposers import REGISTRY
    from specserve.engine.sampling import SamplingParams

    params = SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop or [],
    )
    config = parse_overrides(args.config, scoped=False)
    REGISTRY.config(args.strategy, config)  # fail on a bad strategy before loading the model
    kinds = [args.strategy] if args.strategy in DRAFTER_KINDS else []
    if kinds and not args.drafter_dir:
        raise ValueError(f"generate: strategy {args.strategy!r} needs --drafter-dir")
    loaded, adapter_sha, adapter = _load_target(args)
    drafters = load_drafters(args.drafter_dir, loaded, adapter_sha, kinds) if kinds else {}
    _compile(args, loaded, features=bool(kinds))
    curve, tuned_config = _cached_tuning(args, loaded, args.strategy)
    if kinds and not config and curve is not None:
        tuned_config = _drafter_config(drafters[args.strategy], curve)
    config = config or tuned_config or {}
    pad_width = curve.padded_width if curve is not None else None
    engine = Engine.from_loaded(loaded, pad_width, drafters)
    ids = encode_prompt(loaded.tokenizer, args.prompt, chat=not args.raw)
    state = engine.start(ids, params, args.strategy, config, adapter=adapter)
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


def _tuned_methods(args, loaded, strategies: list[str], log):
    """An engine padding to the device's cheapest widths, and strategy -> config: tuned from the
    device cost curve unless overridden on the command line."""
    from specserve.engine.cost import load_or_measure
    from specserve.engine.decode import Engine
    from specserve.engine.prompts import calibration_prompts, encode_prompt
    from specserve.engine.tuning import load_or_tune

    cache_dir = _cache_dir(args)
    overrides = parse_overrides(getattr(args, "config", []), scoped=True)
    log("measuring / loading the device cost curve ...")
    curve = load_or_measure(loaded.model, loaded.model_id, cache_dir, remeasure=args.retune)
    log(
        "cost of a k-token verify forward (ms): "
        + ", ".join(f"{k}: {v:.1f}" for k, v in sorted(curve.ms.items()))
    )
    engine = Engine.from_loaded(loaded, curve.padded_width)
    prompts = [encode_prompt(loaded.tokenizer, p) for p in calibration_prompts()]
    methods, choices = {}, {}
    for name in strategies:
        if name in overrides or args.no_tune or name == "ar":
            methods[name] = overrides.get(name, {})
            continue
        log(f"tuning {name} on calibration prompts (cached after the first run) ...")
        tuned = load_or_tune(engine, name, curve, prompts, cache_dir, args.retune, log)
        methods[name] = tuned.config
        choices[name] = tuned.model_dump()
        best = tuned.best
        log(
            f"  {name}: {tuned.config} (calibration tau {best.tau:.2f}, width "
            f"{best.mean_width:.1f}, step cost {best.mean_cost:.2f}x, predicted "
            f"{best.predicted_speedup:.2f}x over ar)"
        )
    return engine, methods, choices, curve


DRAFTER_KINDS = ("medusa", "eagle")


def _load_target(args):
    """(loaded, adapter sha256, adapter name): the served model and, with --adapter DIR, its LoRA
    adapter validated (safetensors only, matching base, limits) into the model's LoRA store; the
    fingerprint is what drafters are keyed to. Without --adapter: (loaded, None, None)."""
    loaded = _load(args)
    adapter = getattr(args, "adapter", None)
    if not adapter:
        return loaded, None, None
    from specserve.adapters.resident import ResidentAdapters, base_model_names
    from specserve.adapters.settings import AdapterLimits

    path = Path(adapter).resolve()
    limits = AdapterLimits(root=path.parent)
    resident = ResidentAdapters(loaded.model, base_model_names(loaded.model_id), limits)
    checked = resident.ensure(ADAPTER_NAME, path)
    _log(f"adapter {path} (rank {checked.rank}, sha256 {checked.sha256[:12]}) loaded")
    return loaded, checked.sha256, ADAPTER_NAME


ADAPTER_NAME = "adapter@1"  # the resident name of a command line --adapter


def load_drafters(drafter_dir: Path, loaded, adapter_sha: str | None, kinds: list[str]) -> dict:
    """kind -> Drafter from DIR/<kind>/ (or DIR itself when it holds one artifact), each checked
    against the served model."""
    from specserve.engine.drafters.artifact import MANIFEST, base_weights_sha256, load_drafter

    weights = base_weights_sha256(loaded.model)
    out = {}
    for kind in kinds:
        path = Path(drafter_dir) / kind
        if not (path / MANIFEST).exists():
            path = Path(drafter_dir)
            if (
                not (path / MANIFEST).exists()
                or json.loads((path / MANIFEST).read_text())["kind"] != kind
            ):
                raise ValueError(f"drafter-dir: no {kind} drafter in {drafter_dir}")
        out[kind] = load_drafter(path, loaded.model, loaded.model_id, adapter_sha, weights)
        for note in out[kind].notes:
            _log(f"note: {note}")
    return out


def cmd_train_drafter(args) -> int:
    from tqdm import tqdm

    from specserve.models.load import default_cache_dir
    from specserve.training.run import DrafterTrainSettings, train_drafter

    settings = DrafterTrainSettings(kind=args.kind, budget_minutes=args.budget_minutes)
    loaded, adapter_sha, adapter = _load_target(args)
    cache = args.cache_dir or default_cache_dir()
    drafter = train_drafter(
        loaded.model,
        loaded.tokenizer,
        loaded.model_id,
        loaded.eos_token_ids,
        args.out,
        settings,
        adapter_sha256=adapter_sha,
        data_dir=cache / "distill",
        log=_log,
        progress_bar=lambda total, desc: tqdm(total=total, desc=desc, file=sys.stderr),
        adapter=adapter,
    )
    print(drafter.manifest.model_dump_json(indent=1))
    return 0


def cmd_tune(args) -> int:
    from specserve.engine.lora_batch import lora_rows

    loaded, _, adapter = _load_target(args)
    compile_record = _compile(args, loaded)
    with lora_rows(loaded.model, [adapter]):  # the variant is what gets tuned
        _, _, choices, curve = _tuned_methods(args, loaded, args.strategies.split(","), _log)
    choice = loaded.dtype_choice.model_dump() if loaded.dtype_choice is not None else None
    out = {"dtype": str(loaded.dtype), "dtype_choice": choice, "compile": compile_record}
    out["cost_curve_ms"] = curve.ms
    print(json.dumps(out | {"choices": choices}, indent=1))
    return 0


def cmd_bench(args) -> int:
    from specserve.engine.proposers import REGISTRY
    from specserve.tools import bench

    names = [s for s in args.strategies.split(",") if s]
    baselines = [b for b in args.baselines.split(",") if b]
    for name in names:
        REGISTRY.get(name)
    for b in baselines:
        if b not in bench.BASELINES:
            raise ValueError(f"baselines: unknown {b!r}; valid: {', '.join(bench.BASELINES)}")
    drafter_kinds = [n for n in names if n in DRAFTER_KINDS]
    if drafter_kinds and not args.drafter_dir:
        raise ValueError(f"bench: {', '.join(drafter_kinds)} need --drafter-dir")
    loaded, adapter_sha, adapter = _load_target(args)
    drafters = load_drafters(args.drafter_dir, loaded, adapter_sha, drafter_kinds)
    compile_record = _compile(args, loaded, features=bool(drafter_kinds))
    engine, methods, choices, curve = _tuned_methods(
        args, loaded, [n for n in names if n not in drafter_kinds], _log
    )
    engine.drafters = drafters
    overrides = parse_overrides(args.config, scoped=True)
    for kind, drafter in drafters.items():
        info: dict = {"chosen_from": "device cost curve"}
        methods[kind] = overrides.get(kind) or _drafter_config(drafter, curve, info)
        choices[kind] = {"config": methods[kind], **info}
        _log(f"  {kind}: {methods[kind]} ({info})")
    methods.update({b: None for b in baselines})
    fp32 = _fp32_copy(args, loaded) if "hf_ar_fp32" in baselines else None
    prompts = bench.load_specbench(args.data, args.per_task, loaded.tokenizer)
    _log(f"benchmarking {len(prompts)} prompts x {len(methods)} methods ...")
    totals = bench.run_bench(engine, prompts, methods, args.max_new_tokens, _log, adapter, fp32)
    report = bench.build_report(
        loaded.model_id, _device_name(loaded.device), prompts, args.max_new_tokens, totals, curve
    )
    report["dtype"] = str(loaded.dtype)
    report["dtype_choice"] = (
        loaded.dtype_choice.model_dump()
        if loaded.dtype_choice is not None
        else {"chosen": str(loaded.dtype), "reason": f"--dtype {args.dtype}"}
    )
    report["compile"] = compile_record
    if "ar" in totals:
        _log("checking every divergence from ar (plain forwards over the common prefix) ...")
        report["tie_tolerance"] = tolerance = _tie_tolerance(
            loaded.model, loaded.tokenizer, adapter
        )
        checks = bench.check_contract(
            loaded.model, prompts, totals, tolerance["tolerance"], adapter
        )
        for name, check in checks.items():
            report["results"][name].update(
                {k: check[k] for k in ("divergences", "max_tie_gap", "all_ties")}
            )
    report["cost_curve_ms"] = curve.ms
    report["strategy_configs"] = {n: c for n, c in methods.items() if c is not None}
    report["tuning"] = choices
    if drafters:
        report["drafters"] = {k: d.manifest.model_dump(mode="json") for k, d in drafters.items()}
    if adapter:
        report["adapter"] = {"path": str(Path(args.adapter).resolve()), "sha256": adapter_sha}
    print(bench.format_table(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
        _log(f"wrote {args.out}")
    if args.plot:
        bench.plot_report(report, Path(args.plot))
        _log(f"wrote {args.plot}")
    return 0


def _fp32_copy(args, loaded):
    """The served model in float32 (the same object when it already is), with the same adapter."""
    import copy

    import torch

    if loaded.dtype == torch.float32:
        return loaded.model
    _log("loading a float32 copy for hf_ar_fp32 ...")
    fp32_args = copy.copy(args)
    fp32_args.dtype = "float32"
    fp32_args.compile = "off"  # the baseline is plain generate()
    return _load_target(fp32_args)[0].model


def _tie_tolerance(model, tokenizer, adapter) -> dict:
    """The tolerance a divergence must be within to be a tie, measured on calibration text."""
    from specserve.engine.ties import measure_tolerance, tolerance_sequences

    sequences = tolerance_sequences(tokenizer, model.config.vocab_size)
    return measure_tolerance(model, sequences, adapter=adapter).model_dump()


def cmd_finetune(args) -> int:
    from specserve.adapters.fingerprint import adapter_sha256
    from specserve.adapters.resident import base_model_names
    from specserve.adapters.settings import AdapterLimits
    from specserve.adapters.validate import BaseModelSpec, validate_adapter
    from specserve.training.finetune import FinetuneConfig, finetune, load_examples

    overrides = parse_overrides(args.config, scoped=False)
    if args.budget_minutes is not None:
        overrides["budget_minutes"] = args.budget_minutes
    config = FinetuneConfig.model_validate(overrides)
    if not args.data.is_file():
        raise ValueError(f"data: {args.data} is not a file")
    loaded = _load(args)
    names = base_model_names(loaded.model_id)
    spec = BaseModelSpec.of(loaded.model, names)  # before peft wraps the model
    eos_id = min(loaded.eos_token_ids)
    examples = load_examples(args.data, loaded.tokenizer, eos_id, config.block_size)
    data_desc = {
        "path": str(args.data),
        "sha256": _file_sha256(args.data),
        "examples": len(examples),
    }
    _log(
        f"fine-tuning {loaded.model_id} on {len(examples)} examples for at most {config.budget_minutes} min"
    )
    record = finetune(
        loaded.model, loaded.tokenizer, examples, config, args.out, loaded.model_id, data_desc
    )
    out = args.out.resolve()
    checked = validate_adapter(
        out, spec, AdapterLimits(root=out.parent, max_rank=max(64, config.rank))
    )
    _log(
        f"held-out loss before/after: {record['held_out_loss_before_after']}; {record['steps']} steps"
    )
    print(
        json.dumps(
            {"adapter": str(out), "sha256": adapter_sha256(out), "rank": checked.rank, **record},
            indent=1,
        )
    )
    return 0


def _file_sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cmd_up(args) -> int:
    from specserve.platform.rayserve.up import up

    return up(args.config, args.host, args.port, _cache_dir(args), args.num_cpus, log=_log)


def cmd_variants(args) -> int:
    from specserve.platform.api.client import AdminClient

    client = AdminClient.from_env(args.url, args.token, _cache_dir(args))
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
    elif args.cancel:
        out = client.call("DELETE", f"/variants/{args.name}/drafters/{args.kind}")
    else:
        body = {"kind": args.kind} | (
            {"budget_minutes": args.budget_minutes} if args.budget_minutes else {}
        )
        out = client.call("POST", f"/variants/{args.name}/drafters", body)
        if args.follow:
            out = client.follow(args.name, args.kind, log=_log)
    print(json.dumps(out, indent=1))
    return 0


def cmd_loadtest(args) -> int:
    import torch

    from specserve.platform.api.client import AdminClient
    from specserve.tools import loadtest

    levels = [int(c) for c in args.concurrency.split(",") if c]
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in loadtest.MODES:
            raise ValueError(f"modes: unknown {mode!r}; valid: {', '.join(loadtest.MODES)}")
    capacity = args.overload_capacity or max(levels, default=0)
    if args.overload_factor > 0 and int(args.overload_factor * capacity) < 1:
        raise ValueError("--overload-factor: needs --overload-capacity or --concurrency levels")
    client = AdminClient.from_env(args.url, args.token, _cache_dir(args))
    known = {v["name"] for v in client.list_variants()["variants"]}
    names = [f"load-{i}" for i in range(args.variants)]
    for name in names:
        if name not in known:
            if args.adapter is None:
                raise ValueError(
                    f"variant {name} is not registered: pass --adapter DIR to register it"
                )
            client.register(name, args.model, str(Path(args.adapter).resolve()), {})
    rows = [row for row in map(json.loads, args.data.read_text().splitlines()) if row.get("turns")]
    prompts = loadtest.interleave_tasks(rows)
    tasks = len({row.get("task") or row.get("category") or "" for row in rows})
    results: dict[str, dict[str, dict]] = {}
    engine: dict[str, dict[str, dict | None]] = {}  # where each level's time went in the loop
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
                level = loadtest.run_level(
                    client.url,
                    names or [args.model],
                    prompts,
                    conc,
                    count,
                    args.max_tokens,
                    first,
                )
                first += count
                results.setdefault(mode, {})[str(conc)] = summary = loadtest.summarize(level)
                after = loadtest.engine_figures(loadtest.fetch(client.url, "/metrics"))
                share = loadtest.engine_share(before, after, level.seconds)
                engine.setdefault(mode, {})[str(conc)] = share
                _log(f"{mode} c={conc}: {summary}; engine loop: {share}")
    finally:
        for name in names:
            client.call("PUT", f"/variants/{name}/strategy", {"strategy": None})
    report = {
        "model": args.model,
        "device": _device_name(torch.device("cpu")) + f" (server {client.url})",
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
    targets = names or [args.model]
    if args.overload_factor > 0:
        clients = int(args.overload_factor * capacity)
        _log(f"overload: {clients} clients for {args.overload_seconds} s")
        report["overload"] = loadtest.run_overload(
            client.url,
            targets,
            prompts,
            clients,
            args.overload_seconds,
            args.max_tokens,
            processes=args.overload_processes,
        )
        _log(f"overload: {report['overload']}")
    if args.disconnect > 0:
        _log(f"disconnect: {args.disconnect} streams cut after {args.disconnect_after} tokens")
        report["disconnect"] = loadtest.run_disconnect(
            client.url, targets, prompts, args.disconnect, args.disconnect_after, args.max_tokens
        )
        _log(f"disconnect: {report['disconnect']}")
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


def _drafter_config(drafter, curve, info: dict | None = None) -> dict:
    """Tree size for this drafter on this device: expected τ / (verify + draft cost). `info`
    receives the measured draft cost and the predicted speedup."""
    from specserve.engine.drafters.budget import measure_step_cost, tree_config

    step = measure_step_cost(drafter, curve)
    config = tree_config(drafter.kind, drafter.manifest.accept_rates, curve, step)
    if info is not None:
        info["draft_step_cost"] = round(step, 3)  # relative to a 1-token target forward
        info["predicted_speedup"] = config["predicted_speedup"]
    config.pop("predicted_speedup")
    return config


def _device_name(device) -> str:
    import platform

    import torch

    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    model_name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            ln.split(":", 1)[1].strip()
            for ln in cpuinfo.read_text().splitlines()
            if ln.startswith("model name")
        ]
        model_name = names[0] if names else model_name
    return f"cpu ({model_name}, {torch.get_num_threads()} threads)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="list or pull catalog models")
    models_sub = models.add_subparsers(dest="action", required=True)
    models_sub.add_parser("list")
    pull = models_sub.add_parser("pull")
    pull.add_argument("name")
    pull.add_argument("--cache-dir", type=Path, default=None)
    models.set_defaults(func=cmd_models)

    gen = sub.add_parser("generate", help="stream one completion")
    _add_model_args(gen)
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
    gen.add_argument("--drafter-dir", type=Path, default=None, help="DIR/medusa, DIR/eagle")
    gen.set_defaults(func=cmd_generate)

    for name, func, helptext in (
        ("tune", cmd_tune, "measure the cost curve, pick draft sizes"),
        ("bench", cmd_bench, "benchmark against transformers"),
    ):
        p = sub.add_parser(name, help=helptext)
        _add_model_args(p)
        p.add_argument("--strategies", default="ar,prompt_lookup,lookahead")
        p.add_argument("--retune", action="store_true", help="remeasure cost curve and retune")
        p.add_argument("--no-tune", action="store_true", help="use default strategy configs")
        p.add_argument("--config", action="append", default=[], help="STRATEGY.KEY=VALUE")
        p.set_defaults(func=func)
    b = sub.choices["bench"]
    b.add_argument("--data", type=Path, default=Path("../shared/bench/specbench_dev.jsonl"))
    b.add_argument("--per-task", type=int, default=3)
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--baselines", default="hf_ar,hf_pld")
    b.add_argument("--out", type=Path, default=None)
    b.add_argument("--plot", type=Path, default=None)
    b.add_argument("--drafter-dir", type=Path, default=None, help="DIR/medusa, DIR/eagle")
    for p in (b, sub.choices["tune"]):
        p.add_argument("--adapter", type=Path, default=None, help="LoRA adapter directory")

    t = sub.add_parser("train-drafter", help="train Medusa heads or an EAGLE layer")
    _add_model_args(t)
    t.add_argument("--adapter", type=Path, default=None, help="LoRA adapter directory")
    t.add_argument("--kind", required=True, choices=["medusa", "eagle"])
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--budget-minutes", type=float, default=20.0)
    t.set_defaults(func=cmd_train_drafter)

    ft = sub.add_parser("finetune", help="train a LoRA adapter (a variant) on a .txt/.jsonl file")
    _add_model_args(ft)
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

    upp = sub.add_parser(
        "up", help="run the platform here: store, local Ray, Serve app on one port"
    )
    upp.add_argument(
        "--config",
        type=Path,
        default=config_file("serve.yaml"),
    )
    upp.add_argument("--host", default="127.0.0.1")
    upp.add_argument("--port", type=int, default=8000)
    upp.add_argument("--num-cpus", type=int, default=None, help="CPUs Ray may use (default: all)")
    upp.add_argument("--cache-dir", type=Path, default=None)
    upp.set_defaults(func=cmd_up)

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
    lt.set_defaults(func=cmd_loadtest)

    var = sub.add_parser("variants", help="admin client: register, list, show, delete, train")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", default=None, help="default $SPECSERVE_URL or http://127.0.0.1:8000"
    )
    common.add_argument(
        "--token", default=None, help="default $SPECSERVE_ADMIN_TOKEN or <cache>/admin-token"
    )
    common.add_argument("--cache-dir", type=Path, default=None)
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
    tr.add_argument("--kind", default="eagle", choices=["eagle", "medusa"])
    tr.add_argument("--budget-minutes", type=float, default=None)
    tr.add_argument("--follow", action="store_true")
    tr.add_argument("--cancel", action="store_true")
    var.set_defaults(func=cmd_variants)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, ValidationError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
