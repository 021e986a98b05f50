"""`train_drafter`: self-distill, train and save a drafter of any kind (Medusa, EAGLE) for a
loaded target (plain or peft base + adapter), within a time budget, resumable from `out_dir`.

Steps: training prompts -> target answers (cached per model + adapter, shared by all kinds) ->
draft vocabulary -> teacher features -> the kind's trainer (`kinds.TRAINERS`) -> held-out
acceptance rates and τ -> artifact.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from specserve.engine.decode import Engine
from specserve.engine.drafters.artifact import (
    Drafter,
    Manifest,
    base_weights_sha256,
    build_module,
    save_drafter,
)
from specserve.engine.drafters.specs import EagleSpec, KindName, MedusaSpec
from specserve.engine.drafters.vocab import head_rows
from specserve.engine.lora_batch import lora_rows
from specserve.engine.prompts import encode_prompt
from specserve.engine.sampling import SamplingParams
from specserve.training import examples, trainers
from specserve.training.data import (
    DistillData,
    frequent_vocab,
    generate_answers,
    teacher_features,
    token_counts,
)
from specserve.training.kinds import TRAINERS, Sequences, TrainingJob
from specserve.training.prompts import SOURCE, training_prompts


class DrafterTrainSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: KindName
    budget_minutes: float = Field(20.0, gt=0, description="whole command, data included")
    data_share: float = Field(0.6, gt=0, le=1, description="most of the budget data may take")
    features_share: float = Field(
        0.15, ge=0, le=1, description="most of the budget teacher features may take after data"
    )
    prompts: int = Field(480, ge=2)
    heldout: int = Field(24, ge=1, description="prompts kept out of training, for evaluation")
    max_new_tokens: int = Field(128, ge=1)
    gen_batch: int = Field(24, ge=1)
    draft_vocab: int = Field(8192, ge=16)
    eagle_context: int = Field(
        64, ge=1, description="prompt tokens kept before each answer in EAGLE training rows"
    )
    eval_seconds: float = Field(60, ge=0, description="time reserved for held-out evaluation")
    tau_prompts: int = Field(6, ge=0, description="held-out prompts decoded to measure τ")
    medusa: MedusaSpec = MedusaSpec()
    eagle: EagleSpec = EagleSpec()
    trainer: trainers.TrainerSettings = trainers.TrainerSettings()


def _data_key(weights: str, adapter: str | None, s: DrafterTrainSettings) -> str:
    raw = json.dumps([weights, adapter, s.prompts, s.max_new_tokens, SOURCE])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def train_drafter(
    model,
    tokenizer,
    model_id: str,
    eos_ids: frozenset[int],
    out_dir: Path,
    settings: DrafterTrainSettings,
    adapter_sha256: str | None = None,
    data_dir: Path | None = None,
    log: Callable[[str], object] = lambda msg: None,
    progress_bar: Callable | None = None,
    adapter: str | None = None,
) -> Drafter:
    """Train (or resume) and save; returns the loaded drafter. `progress_bar(total, desc)`
    makes a tqdm-like bar (update(n), set_postfix_str(s), close()). `adapter`: the resident
    adapter every forward of the target applies (None: the model as it is)."""
    with lora_rows(model, [adapter]):
        return _train(
            model,
            tokenizer,
            model_id,
            eos_ids,
            out_dir,
            settings,
            adapter_sha256,
            data_dir,
            log,
            progress_bar,
        )


def _train(
    model,
    tokenizer,
    model_id,
    eos_ids,
    out_dir,
    settings,
    adapter_sha256,
    data_dir,
    log,
    progress_bar,
) -> Drafter:
    started = time.monotonic()
    budget_s = settings.budget_minutes * 60
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data_dir = Path(data_dir or out_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    bar = progress_bar or _NoBar
    weights = base_weights_sha256(model)

    # 1. data: the target's own greedy answers to training prompts (cached, resumable)
    data_file = data_dir / f"distill-{_data_key(weights, adapter_sha256, settings)}.pt"
    if data_file.exists():
        data = DistillData.load(data_file)
    else:
        texts = training_prompts(settings.prompts)
        data = DistillData(
            prompts=[encode_prompt(tokenizer, t) for t in texts],
            answers=[None] * len(texts),
            max_new_tokens=settings.max_new_tokens,
            source=SOURCE,
        )
    missing = len(data.answers) - len(data.done)
    if missing:
        log(f"generating {missing} answers (batched, {settings.gen_batch} per batch) ...")
        b = bar(missing, "distill")
        generate_answers(
            model,
            data,
            eos_ids,
            settings.gen_batch,
            data_file,
            deadline=started + settings.data_share * budget_s,
            progress=b.update,
        )
        b.close()
    done = data.done
    if len(done) < 2 + settings.heldout // 4:
        raise ValueError(f"train-drafter: only {len(done)} answers within the budget; raise it")
    heldout_n = min(settings.heldout, max(len(done) // 10, 1))
    held, train_idx = done[-heldout_n:], done[:-heldout_n]
    log(
        f"data: {len(train_idx)} training / {len(held)} held-out examples "
        f"({data.seconds:.0f}s of generation)"
    )

    # 2. the draft vocabulary, the kind's spec and the teacher features it learns from
    trainer = TRAINERS.get(settings.kind)
    kind = trainer.name
    seqs = [data.sequence(i) for i in train_idx]
    held_seqs = [data.sequence(i) for i in held]
    plens = [len(data.prompts[i]) for i in train_idx]
    held_plens = [len(data.prompts[i]) for i in held]
    vocab_size = model.config.vocab_size
    counts = token_counts([data.answers[i] for i in train_idx], vocab_size)
    draft_vocab = frequent_vocab(counts, settings.draft_vocab)
    index = examples.vocab_index(draft_vocab, vocab_size)
    spec = trainer.spec(settings, len(draft_vocab))
    layers = trainer.teacher_layers(spec)
    log(f"teacher features (layers {layers}) over {len(seqs) + len(held_seqs)} sequences ...")
    held_feats = teacher_features(model, held_seqs, layers)
    share = min(settings.data_share + settings.features_share, 1.0)
    feats = teacher_features(model, seqs, layers, deadline=started + share * budget_s)
    kept = [i for i, f in enumerate(feats) if f is not None]
    if len(kept) < 2:
        raise ValueError("train-drafter: no time left for teacher features; raise the budget")
    if len(kept) < len(seqs):  # a slow forward (e.g. bf16 without native bf16): fewer rows
        log(f"teacher features: {len(kept)} of {len(seqs)} sequences within the budget")
        train_idx, seqs, plens, feats = (
            [x[i] for i in kept] for x in (train_idx, seqs, plens, feats)
        )
    module = build_module(model, spec).to(model.device)
    rows_w = head_rows(model, draft_vocab.to(model.device)).float()
    module.float()
    ckpt = out_dir / "checkpoint.pt"
    train_s = budget_s - (time.monotonic() - started) - settings.eval_seconds
    if ckpt.exists():
        log(f"resuming from {ckpt}")
    log(f"training {kind} for up to {max(train_s, 0):.0f}s ...")
    tbar = bar(None, f"train {kind}")

    def progress(state):
        tbar.update(1)
        recent = state["losses"][-20:]
        tbar.set_postfix_str(f"loss {sum(recent) / len(recent):.3f} ep {state['epoch']}")

    job = TrainingJob(
        module=module,
        target=model,
        rows_w=rows_w,
        index=index,
        train=Sequences(seqs, plens, feats),
        heldout=Sequences(held_seqs, held_plens, held_feats),
        spec=spec,
        settings=settings,
        budget_s=max(train_s, 1.0),
        checkpoint=ckpt,
        progress=progress,
    )
    trained = trainer.train(job)
    state, acc = trained.state, trained.accept_rates
    tbar.close()
    module.to(model.dtype).eval()
    for p in module.parameters():
        p.requires_grad_(False)
    log("held-out acceptance (rank 0 per depth): " + ", ".join(f"{a[0]:.2f}" for a in acc))

    manifest = Manifest(
        kind=kind,
        base_model_id=model_id,
        base_weights_sha256=weights,
        adapter_sha256=adapter_sha256,
        spec=spec,
        draft_vocab_size=len(draft_vocab),
        accept_rates=[[round(x, 4) for x in row] for row in acc],
        feature_dtype=str(model.dtype),  # features from the target as loaded: the serving dtype
        training={
            "data": data.source,
            "examples": len(train_idx),
            "heldout_examples": len(held),
            "answer_tokens": int(sum(len(data.answers[i]) for i in train_idx)),
            "max_new_tokens": data.max_new_tokens,
            "generation_seconds": round(data.seconds, 1),
            "train_seconds": round(state["elapsed"], 1),
            "steps": state["step"],
            "epochs": state["epoch"],
            "heldout_losses": state.get("heldout_losses", []),
            "best_epoch": state.get("best_epoch"),
            "final_loss": state["losses"][-1] if state["losses"] else None,
            "settings": settings.model_dump(mode="json"),
            "device": str(model.device),
            "dtype": str(model.dtype),
        },
    )
    drafter = Drafter(manifest, spec, module, draft_vocab.to(model.device), model)
    tau, config = heldout_tau(
        model, tokenizer, eos_ids, drafter, [data.prompts[i] for i in held], settings
    )
    manifest.heldout_tau = tau
    manifest.training["heldout_tau_config"] = config
    save_drafter(out_dir, manifest, module, draft_vocab)
    log(f"saved {kind} drafter to {out_dir} (held-out τ {tau})")
    return drafter


def heldout_tau(
    model, tokenizer, eos_ids, drafter: Drafter, prompts, settings
) -> tuple[float | None, dict]:
    """Mean τ of greedy decoding of held-out prompts with the drafter (a mid-size tree)."""
    config = TRAINERS.get(drafter.kind).heldout_config
    if not settings.tau_prompts:
        return None, config
    engine = Engine(model, tokenizer, eos_ids, drafters={drafter.kind: drafter})
    tokens = forwards = 0
    params = SamplingParams(max_new_tokens=min(settings.max_new_tokens, 64))
    for ids in prompts[: settings.tau_prompts]:
        res = engine.generate(ids, params, drafter.kind, config)
        tokens += len(res.output_ids)
        forwards += res.forwards
    return round(tokens / max(forwards, 1), 3), config


class _NoBar:
    def __init__(self, total=None, desc=""):
        pass

    def update(self, n=1):
        pass

    def set_postfix_str(self, s):
        pass

    def close(self):
        pass
