"""`train_drafter`: train and save a drafter of any kind (Medusa, EAGLE) for a loaded target
(plain or peft base + adapter), within a time budget, resumable from `out_dir`.

Steps: the fixed corpus (`corpus`) -> teacher data by prefill (`features`, cached per model +
adapter + dtype + layers + corpus, shared by every kind and budget) -> draft vocabulary (the
target's most frequent greedy tokens) -> the kind's trainer (`kinds.TRAINERS`) -> held-out
acceptance rates and τ -> artifact. Nothing is generated before training.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
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
from specserve.engine.sampling import SamplingParams
from specserve.training import examples, trainers
from specserve.training.corpus import Corpus, CorpusSettings, build_corpus
from specserve.training.data import frequent_vocab, token_counts
from specserve.training.features import cache_key, teacher_data
from specserve.training.kinds import TRAINERS, Sequences, TrainingJob


class DrafterTrainSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: KindName
    budget_minutes: float = Field(20.0, gt=0, description="whole command, teacher prefill included")
    corpus: CorpusSettings = CorpusSettings()
    features_share: float = Field(
        0.5, gt=0, le=1, description="most of the budget teacher prefill may take (cached: none)"
    )
    prefill_tokens: int = Field(4096, ge=16, description="padded tokens per prefill batch")
    heldout: int = Field(48, ge=1, description="corpus sequences kept out of training")
    draft_vocab: int = Field(8192, ge=16)
    eagle_context: int = Field(
        64, ge=1, description="prompt tokens kept before each answer in EAGLE training rows"
    )
    eval_seconds: float = Field(60, ge=0, description="time reserved for held-out evaluation")
    tau_prompts: int = Field(6, ge=0, description="held-out prompts decoded to measure τ")
    tau_tokens: int = Field(64, ge=1, description="tokens decoded per held-out τ prompt")
    medusa: MedusaSpec = MedusaSpec()
    eagle: EagleSpec = EagleSpec()
    trainer: trainers.TrainerSettings = trainers.TrainerSettings()


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
    """Train (or resume) and save; returns the loaded drafter. `data_dir` keeps the teacher
    data (default: `out_dir`). `progress_bar(total, desc)` makes a tqdm-like bar (update(n),
    set_postfix_str(s), close()). `adapter`: the resident adapter every forward of the target
    applies (None: the model as it is)."""
    run = _Run(model, tokenizer, model_id, eos_ids, settings, adapter_sha256, log)
    with lora_rows(model, [adapter]):
        return run.train(Path(out_dir), Path(data_dir or out_dir), progress_bar or _NoBar)


class _Run:
    """One training: the target, its identity and the settings, shared by the steps below."""

    def __init__(self, model, tokenizer, model_id, eos_ids, settings, adapter_sha256, log):
        self.model, self.tokenizer, self.model_id = model, tokenizer, model_id
        self.eos_ids, self.settings, self.log = eos_ids, settings, log
        self.adapter_sha256 = adapter_sha256
        self.started = time.monotonic()
        self.budget_s = settings.budget_minutes * 60
        self.weights = base_weights_sha256(model)
        self.trainer = TRAINERS.get(settings.kind)

    def sequences(self, corpus: Corpus, data_dir: Path, layers, deadline, bar) -> Sequences:
        """The corpus's teacher data, cached under data_dir; sequences not reached are dropped."""
        distinct = tuple(dict.fromkeys(layers))  # one cache for every kind that reads these layers
        key = cache_key(
            self.weights, self.adapter_sha256, self.model.dtype, distinct, corpus.digest
        )
        pbar = bar(len(corpus.sequences), "teacher")
        teacher = teacher_data(
            self.model,
            corpus.sequences,
            distinct,
            data_dir / f"teacher-{key}",
            self.settings.prefill_tokens,
            deadline,
            self.log,
            pbar.update,
        )
        pbar.close()
        kept = [i for i, f in enumerate(teacher.features) if f is not None]
        slots = [distinct.index(layer) for layer in layers]
        return Sequences(
            [corpus.sequences[i] for i in kept],
            [corpus.prompt_lens[i] for i in kept],
            [teacher.features[i][:, slots] for i in kept],  # [T, len(layers), H]
            [teacher.greedy[i] for i in kept],
        )

    def train(self, out_dir: Path, data_dir: Path, bar) -> Drafter:
        s = self.settings
        out_dir.mkdir(parents=True, exist_ok=True)
        data_dir.mkdir(parents=True, exist_ok=True)
        corpus = build_corpus(self.tokenizer, min(self.eos_ids or {0}), s.corpus)
        train_c, held_c = corpus.split(min(s.heldout, max(len(corpus.sequences) // 10, 1)))
        spec0 = self.trainer.spec(s, s.draft_vocab)
        layers = self.trainer.teacher_layers(spec0)
        self.log(
            f"teacher data (layers {layers}) for {len(corpus.sequences)} sequences "
            f"({corpus.source}) ..."
        )
        held = self.sequences(held_c, data_dir, layers, None, bar)
        deadline = self.started + s.features_share * self.budget_s
        train = self.sequences(train_c, data_dir, layers, deadline, bar)
        if len(train.tokens) < 2:
            raise ValueError("train-drafter: no time left for teacher data; raise the budget")
        vocab_size = self.model.config.vocab_size
        counts = token_counts(
            [g[p - 1 :].tolist() for g, p in zip(train.greedy, train.prompt_lens)], vocab_size
        )
        draft_vocab = frequent_vocab(counts, s.draft_vocab)
        spec = self.trainer.spec(s, len(draft_vocab))
        if s.trainer.autocast == "auto":  # bf16 autocast where the target serves bf16
            precision = "bfloat16" if self.model.dtype == torch.bfloat16 else "off"
            s = s.model_copy(
                update={"trainer": s.trainer.model_copy(update={"autocast": precision})}
            )
        module = build_module(self.model, spec).to(self.model.device).float()
        rows_w = head_rows(self.model, draft_vocab.to(self.model.device)).float()
        ckpt = out_dir / "checkpoint.pt"
        train_s = self.budget_s - (time.monotonic() - self.started) - s.eval_seconds
        if ckpt.exists():
            self.log(f"resuming from {ckpt}")
        self.log(
            f"training {self.trainer.name} for up to {max(train_s, 0):.0f}s on "
            f"{sum(map(len, train.tokens))} tokens of {len(train.tokens)} sequences ..."
        )
        tbar = bar(None, f"train {self.trainer.name}")

        def progress(state):
            tbar.update(1)
            recent = state["losses"][-20:]
            tbar.set_postfix_str(f"loss {sum(recent) / len(recent):.3f} ep {state['epoch']}")

        job = TrainingJob(
            module=module,
            target=self.model,
            rows_w=rows_w,
            index=examples.vocab_index(draft_vocab, vocab_size),
            train=train,
            heldout=held,
            spec=spec,
            settings=s,
            budget_s=max(train_s, 1.0),
            checkpoint=ckpt,
            progress=progress,
        )
        trained = self.trainer.train(job)
        tbar.close()
        module.to(self.model.dtype).eval()
        for p in module.parameters():
            p.requires_grad_(False)
        acc = trained.accept_rates
        self.log("held-out acceptance (rank 0 per depth): " + ", ".join(f"{a[0]:.2f}" for a in acc))
        manifest = self.manifest(spec, draft_vocab, acc, trained.state, corpus, train, held)
        drafter = Drafter(manifest, spec, module, draft_vocab.to(self.model.device), self.model)
        prompts = [t[:p] for t, p in zip(held.tokens, held.prompt_lens)]
        tau, config = heldout_tau(self.model, self.tokenizer, self.eos_ids, drafter, prompts, s)
        manifest.heldout_tau = tau
        manifest.training["heldout_tau_config"] = config
        save_drafter(out_dir, manifest, module, draft_vocab)
        self.log(f"saved {self.trainer.name} drafter to {out_dir} (held-out τ {tau})")
        return drafter

    def manifest(self, spec, draft_vocab, acc, state, corpus, train, held) -> Manifest:
        return Manifest(
            kind=self.trainer.name,
            base_model_id=self.model_id,
            base_weights_sha256=self.weights,
            adapter_sha256=self.adapter_sha256,
            spec=spec,
            draft_vocab_size=len(draft_vocab),
            accept_rates=[[round(x, 4) for x in row] for row in acc],
            feature_dtype=str(self.model.dtype),  # teacher data from the target as loaded
            training={
                "data": corpus.source,
                "examples": len(train.tokens),
                "heldout_examples": len(held.tokens),
                "tokens": int(sum(map(len, train.tokens))),
                "answer_tokens": int(
                    sum(len(t) - p for t, p in zip(train.tokens, train.prompt_lens))
                ),
                "train_seconds": round(state["elapsed"], 1),
                "steps": state["step"],
                "epochs": state["epoch"],
                "heldout_losses": state.get("heldout_losses", []),
                "best_epoch": state.get("best_epoch"),
                "final_loss": state["losses"][-1] if state["losses"] else None,
                "settings": self.settings.model_dump(mode="json"),
                "device": str(self.model.device),
                "dtype": str(self.model.dtype),
            },
        )


def heldout_tau(
    model, tokenizer, eos_ids, drafter: Drafter, prompts, settings
) -> tuple[float | None, dict]:
    """Mean τ of greedy decoding of held-out prompts with the drafter (a mid-size tree)."""
    config = TRAINERS.get(drafter.kind).heldout_config
    if not settings.tau_prompts:
        return None, config
    engine = Engine(model, tokenizer, eos_ids, drafters={drafter.kind: drafter})
    tokens = forwards = 0
    params = SamplingParams(max_new_tokens=settings.tau_tokens)
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
