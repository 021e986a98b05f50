"""Per drafter kind, how `train_drafter` trains it: the spec to train, the teacher layers it learns
from, its training loop and the tree its held-out τ is decoded with.

The engine may not import training, so the engine's half of a kind (`drafters.kinds.DRAFTER_KINDS`:
spec, module, tree budget) cannot name its trainer; `TRAINERS` adds one per engine kind, holding
that kind's entry (a test pins that every kind has exactly one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn

from specserve.engine.drafters.kinds import EAGLE_KIND, MEDUSA_KIND, DrafterKind
from specserve.engine.drafters.specs import EagleSpec, MedusaSpec
from specserve.engine.registry import Registry
from specserve.training import examples
from specserve.training.settings import DrafterTrainSettings
from specserve.training.trainers import eagle, medusa


@dataclass(frozen=True)
class Sequences:
    """Corpus sequences (prompt + answer) with their prompt lengths and teacher data."""

    tokens: list[list[int]]
    prompt_lens: list[int]
    features: list[torch.Tensor]  # each [T, len(teacher_layers), H]
    greedy: list[torch.Tensor]  # each [T]: the target's argmax after position t


@dataclass(frozen=True)
class TrainingJob:
    """What a kind's trainer gets: its untrained module (float32, on the target's device), the
    frozen target, the draft vocabulary's LM-head rows and index, and the data."""

    module: nn.Module
    target: Any
    rows_w: torch.Tensor  # [v, H] float32 rows of the frozen LM head for the draft vocabulary
    index: torch.Tensor  # [vocab] position in the draft vocabulary (`examples.vocab_index`)
    train: Sequences
    heldout: Sequences
    spec: BaseModel
    settings: DrafterTrainSettings
    budget_s: float
    checkpoint: Path
    progress: Callable[[dict], None]


@dataclass(frozen=True)
class Trained:
    state: dict  # the training loop's state (steps, epochs, losses, best epoch)
    accept_rates: list[list[float]]  # held-out acc[depth][rank]


@dataclass(frozen=True)
class KindTrainer:
    """How one drafter kind (`kind`, the engine's entry) is trained."""

    kind: DrafterKind
    # (settings, draft vocabulary size) -> the spec to train
    spec: Callable[[DrafterTrainSettings, int], BaseModel]
    # spec -> the target layers recorded at every position (`data.teacher_features`)
    teacher_layers: Callable[[BaseModel], tuple[int, ...]]
    train: Callable[[TrainingJob], Trained]
    heldout_config: dict  # strategy config of the held-out τ decode (a mid-size tree)

    @property
    def name(self) -> str:
        return self.kind.name


def _medusa_spec(settings: DrafterTrainSettings, vocab_size: int) -> MedusaSpec:
    """The settings' heads; own LM heads span the whole draft vocabulary."""
    spec = settings.medusa
    return spec.model_copy(update={"own_head": vocab_size}) if spec.own_head else spec


def _train_medusa(job: TrainingJob) -> Trained:
    heads = job.spec.heads
    train, held = (
        examples.medusa_rows(s.tokens, s.prompt_lens, s.features, s.greedy, heads, job.index)
        for s in (job.train, job.heldout)
    )
    state = medusa.train_medusa(
        job.module,
        job.rows_w,
        train,
        job.settings.trainer,
        job.budget_s,
        job.checkpoint,
        job.progress,
        held,
    )
    return Trained(state, medusa.medusa_accept_rates(job.module, job.rows_w, held, job.spec.topk))


def _eagle_spec(settings: DrafterTrainSettings, vocab_size: int) -> EagleSpec:
    return settings.eagle


def _eagle_layers(spec: EagleSpec) -> tuple[int, ...]:
    """Its input layers, then the final feature (the regression target) in the last slot."""
    return tuple(spec.feature_layers) + (-1,)


def _train_eagle(job: TrainingJob) -> Trained:
    ts, context = job.settings.trainer, job.settings.eagle_context
    train, held = (
        examples.eagle_batches(
            s.tokens, s.prompt_lens, s.features, s.greedy, job.index, size, context
        )
        for s, size in ((job.train, ts.eagle_batch_seqs), (job.heldout, 4))
    )
    std = None  # fused features: noise is added after fusion, scaled by its own std
    if job.module.fuse is None:
        std = torch.cat([f[:, 0].float() for f in job.train.features]).std(
            0
        )  # [H] of the input layer
    state = eagle.train_eagle(
        job.module,
        job.target,
        job.rows_w,
        train,
        ts,
        job.budget_s,
        job.checkpoint,
        job.progress,
        std,
        held,
    )
    acc = eagle.eagle_accept_rates(
        job.module, job.target, job.rows_w, held, ts.eval_depth, ts.eval_topk
    )
    return Trained(state, acc)


TRAINERS: Registry[KindTrainer] = Registry("drafter trainer", "drafter trainers")
TRAINERS.register(
    KindTrainer(MEDUSA_KIND, _medusa_spec, lambda spec: (-1,), _train_medusa, {"tree_size": 10})
)
TRAINERS.register(
    KindTrainer(
        EAGLE_KIND,
        _eagle_spec,
        _eagle_layers,
        _train_eagle,
        {"depth": 5, "topk": 4, "total_tokens": 12},
    )
)
