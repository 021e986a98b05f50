"""`train_drafter`: train and save a drafter of any kind (Medusa, EAGLE) for a loaded target
(plain or peft base + adapter), within a time budget, resumable from `out_dir`.

Steps: the fixed corpus (`corpus`; with served traffic, `traffic_corpus` too: its most recent
requests are the held-out set, its older ones train beside the corpus) -> teacher data by
prefill (`features`, cached per model + adapter + dtype + layers + corpus, shared by every kind
and budget) -> draft vocabulary (the target's most frequent greedy tokens) -> the kind's trainer
(`kinds.TRAINERS`) -> held-out acceptance rates and τ -> artifact. Nothing is generated before
training.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from specserve.engine.drafters.artifact import (
    Drafter,
    Manifest,
    base_weights_sha256,
    build_module,
    save_drafter,
)
from specserve.engine.drafters.vocab import head_rows
from specserve.engine.lora.batch import lora_rows
from specserve.training import examples, precision
from specserve.training.corpus import Corpus, build_corpus, traffic_corpus
from specserve.training.data import frequent_vocab, token_counts
from specserve.training.features import cache_key, teacher_data
from specserve.training.heldout import heldout_tau
from specserve.training.kinds import TRAINERS, Sequences, Trained, TrainingJob
from specserve.training.settings import DrafterTrainSettings
from specserve.training.traffic import ServedExample


def _quiet(msg: str) -> None:
    pass


@dataclass(frozen=True)
class TrainRun:
    """Who trains a drafter, and how: the loaded target (plain, or the base under the adapter
    whose sha256 is `adapter_sha256`), its identity, the settings and where progress is logged."""

    model: Any
    tokenizer: Any
    model_id: str
    eos_ids: frozenset[int]
    settings: DrafterTrainSettings
    adapter_sha256: str | None = None
    log: Callable[[str], object] = _quiet


def train_drafter(
    model,
    tokenizer,
    model_id: str,
    eos_ids: frozenset[int],
    out_dir: Path,
    settings: DrafterTrainSettings,
    adapter_sha256: str | None = None,
    data_dir: Path | None = None,
    log: Callable[[str], object] = _quiet,
    progress_bar: Callable | None = None,
    adapter: str | None = None,
    served: list[ServedExample] | None = None,
    traffic_dir: Path | None = None,
) -> Drafter:
    """Train (or resume) and save; returns the loaded drafter. `data_dir` keeps the teacher
    data (default: `out_dir`). `progress_bar(total, desc)` makes a tqdm-like bar (update(n),
    set_postfix_str(s), close()). `adapter`: the resident adapter every forward of the target
    applies (None: the model as it is). `served`: the variant's traffic, oldest first (its
    teacher data goes to `traffic_dir`, default `out_dir`/traffic, which the caller owns)."""
    training = _Training(
        TrainRun(model, tokenizer, model_id, eos_ids, settings, adapter_sha256, log)
    )
    out_dir = Path(out_dir)
    parts = _Parts(Path(data_dir or out_dir), Path(traffic_dir or out_dir / "traffic"), served)
    with lora_rows(model, [adapter]):
        return training.train(out_dir, parts, progress_bar or _NoBar)


class _Parts:
    """Where a training's corpora and their teacher data come from: the fixed corpus (cached in
    `data_dir`) and, when given, served traffic (in `traffic_dir`)."""

    def __init__(self, data_dir: Path, traffic_dir: Path, served: list[ServedExample] | None):
        self.data_dir, self.traffic_dir, self.served = data_dir, traffic_dir, served

    def split(self, run: TrainRun, eos_id: int):
        """([(corpus, its teacher dir, repeats)] to train on, (held-out corpus, its dir), the
        corpora's description). Without traffic the corpus's last sequences are held out."""
        s = run.settings
        corpus = build_corpus(run.tokenizer, eos_id, s.corpus)
        # the same split with or without traffic: one cached teacher set for the corpus
        train_c, held_c = corpus.split(min(s.heldout, max(len(corpus.sequences) // 10, 1)))
        if self.served is None:
            return [(train_c, self.data_dir, 1)], (held_c, self.data_dir), corpus.source
        older, recent = traffic_split(run.tokenizer, eos_id, self.served, s)
        train = [(train_c, self.data_dir, 1), (older, self.traffic_dir, s.traffic_weight)]
        source = (
            f"{corpus.source} + {len(older.sequences) + len(recent.sequences)} served requests"
            f" ({len(recent.sequences)} most recent held out)"
        )
        return train, (recent, self.traffic_dir), source


class _Training:
    """One training of `run`: its clock, the target's weights digest and the kind's trainer,
    shared by the steps below."""

    def __init__(self, run: TrainRun):
        self.run, self.model, self.log = run, run.model, run.log
        self.settings = run.settings
        self.budget_s = run.settings.budget_minutes * 60
        self.weights = base_weights_sha256(run.model)
        self.trainer = TRAINERS.get(run.settings.kind)
        self.precision = precision.resolved(run.settings, run.model)
        self.started = time.monotonic()  # the budget's clock: after the one-off measurement
        run.log(
            f"precision: teacher prefill {self.precision['teacher']}, training "
            f"{self.precision['trainer']} (bf16 autocast or off; target {run.model.dtype})"
        )

    def sequences(
        self, corpus: Corpus, data_dir: Path, layers, deadline, bar, autocast: bool = False
    ) -> Sequences:
        """The corpus's teacher data, cached under data_dir; sequences not reached are dropped.
        `autocast`: prefilled under bf16 autocast (training data only, never held-out)."""
        data_dir.mkdir(parents=True, exist_ok=True)
        distinct = tuple(dict.fromkeys(layers))  # one cache for every kind that reads these layers
        key = cache_key(
            self.weights,
            self.run.adapter_sha256,
            self.model.dtype,
            distinct,
            autocast,
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
            autocast,
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

    def train(self, out_dir: Path, parts: _Parts, bar) -> Drafter:
        """Teacher data -> draft vocabulary -> the kind's trainer -> held-out τ -> the artifact
        saved in `out_dir`; returns the drafter."""
        out_dir.mkdir(parents=True, exist_ok=True)
        train, held, source = self.teacher_sets(parts, bar)
        draft_vocab = self.draft_vocab(train)
        spec = self.trainer.spec(self.settings, len(draft_vocab))
        module = build_module(self.model, spec).to(self.model.device).float()
        job = self.job(module, spec, draft_vocab, train, held, out_dir / "checkpoint.pt")
        tbar = bar(None, f"train {self.trainer.name}")
        trained = self.trainer.train(replace(job, progress=_progress(tbar)))
        tbar.close()
        module.to(self.model.dtype).eval()
        for p in module.parameters():
            p.requires_grad_(False)
        acc = trained.accept_rates
        self.log("held-out acceptance (rank 0 per depth): " + ", ".join(f"{a[0]:.2f}" for a in acc))
        manifest = self.manifest(spec, draft_vocab, trained, source, train, held)
        drafter = Drafter(manifest, spec, module, draft_vocab.to(self.model.device), self.model)
        prompts = [t[:p] for t, p in zip(held.tokens, held.prompt_lens)]
        run = self.run
        tau, config = heldout_tau(
            self.model, run.tokenizer, run.eos_ids, drafter, prompts, job.settings
        )
        manifest.heldout_tau = tau
        manifest.training["heldout_tau_config"] = config
        save_drafter(out_dir, manifest, module, draft_vocab)
        self.log(f"saved {self.trainer.name} drafter to {out_dir} (held-out τ {tau})")
        return drafter

    def teacher_sets(self, parts: _Parts, bar) -> tuple[Sequences, Sequences, str]:
        """(training sequences, held-out sequences, their description) with teacher data; the
        training ones only as far as the budget's `features_share` reaches."""
        s = self.settings
        train_parts, (held_c, held_dir), source = parts.split(
            self.run, min(self.run.eos_ids or {0})
        )
        layers = self.trainer.teacher_layers(self.trainer.spec(s, s.draft_vocab))
        total = len(held_c.sequences) + sum(len(c.sequences) for c, _, _ in train_parts)
        self.log(f"teacher data (layers {layers}) for {total} sequences ({source}) ...")
        held = self.sequences(held_c, held_dir, layers, None, bar)
        # the training corpus's prefill may take features_share of the budget left now
        left = self.budget_s - (time.monotonic() - self.started)
        deadline = time.monotonic() + s.features_share * left
        bf16 = self.precision["teacher"] == "bfloat16"
        train = _joined(
            [self.sequences(c, d, layers, deadline, bar, bf16) for c, d, _ in train_parts],
            [repeats for _, _, repeats in train_parts],
        )
        if len(train.tokens) < 2:
            raise ValueError("train-drafter: no time left for teacher data; raise the budget")
        return train, held, source

    def draft_vocab(self, train: Sequences) -> torch.Tensor:
        """The target's most frequent greedy tokens over the training answers."""
        counts = token_counts(
            [g[p - 1 :].tolist() for g, p in zip(train.greedy, train.prompt_lens)],
            self.model.config.vocab_size,
        )
        return frequent_vocab(counts, self.settings.draft_vocab)

    def job(self, module, spec, draft_vocab, train, held, ckpt: Path) -> TrainingJob:
        """What the kind's trainer gets, with the time left after evaluation's share (no
        progress callback yet)."""
        rows_w = head_rows(self.model, draft_vocab.to(self.model.device)).float()
        train_s = self.budget_s - (time.monotonic() - self.started) - self.settings.eval_seconds
        if ckpt.exists():
            self.log(f"resuming from {ckpt}")
        self.log(
            f"training {self.trainer.name} for up to {max(train_s, 0):.0f}s on "
            f"{sum(map(len, train.tokens))} tokens of {len(train.tokens)} sequences ..."
        )
        return TrainingJob(
            module=module,
            target=self.model,
            rows_w=rows_w,
            index=examples.vocab_index(draft_vocab, self.model.config.vocab_size),
            train=train,
            heldout=held,
            spec=spec,
            settings=precision.with_trainer(self.settings, self.precision["trainer"]),
            budget_s=max(train_s, 1.0),
            checkpoint=ckpt,
            progress=_quiet,
        )

    def manifest(self, spec, draft_vocab, trained: Trained, source: str, train, held) -> Manifest:
        state = trained.state
        return Manifest(
            kind=self.trainer.name,
            base_model_id=self.run.model_id,
            base_weights_sha256=self.weights,
            adapter_sha256=self.run.adapter_sha256,
            spec=spec,
            draft_vocab_size=len(draft_vocab),
            accept_rates=[[round(x, 4) for x in row] for row in trained.accept_rates],
            feature_dtype=str(self.model.dtype),  # teacher data from the target as loaded
            training={
                "data": source,
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
                "precision": self.precision,  # resolved: teacher prefill and training
            },
        )


def _progress(tbar) -> Callable[[dict], None]:
    """The training loop's progress callback: one bar step, the recent mean loss and epoch."""

    def progress(state: dict) -> None:
        tbar.update(1)
        recent = state["losses"][-20:]
        tbar.set_postfix_str(f"loss {sum(recent) / len(recent):.3f} ep {state['epoch']}")

    return progress


def traffic_split(
    tokenizer, eos_id: int, served: list[ServedExample], settings: DrafterTrainSettings
) -> tuple[Corpus, Corpus]:
    """(older, most recent) of the served requests: the most recent `traffic_heldout` share (at
    least one) is held out, the older ones train."""
    traffic = traffic_corpus(tokenizer, eos_id, served, settings.corpus.max_tokens)
    held_n = max(round(len(traffic.sequences) * settings.traffic_heldout), 1)
    if len(traffic.sequences) < held_n + 1:
        raise ValueError(f"train-drafter: {len(traffic.sequences)} usable served requests (need 2)")
    return traffic.split(held_n)


def _joined(parts: list[Sequences], repeats: list[int]) -> Sequences:
    """The parts' sequences in one set, each part's `repeats` times (tensors shared, not copied)."""
    fields = ([], [], [], [])
    for part, n in zip(parts, repeats, strict=True):
        for _ in range(n):
            for out, got in zip(
                fields, (part.tokens, part.prompt_lens, part.features, part.greedy)
            ):
                out.extend(got)
    return Sequences(*fields)


class _NoBar:
    def __init__(self, total=None, desc=""):
        pass

    def update(self, n=1):
        pass

    def set_postfix_str(self, s):
        pass

    def close(self):
        pass
