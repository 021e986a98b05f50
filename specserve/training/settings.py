"""What a drafter training is asked to do: `DrafterTrainSettings` (budget, corpus, held-out
sets, draft vocabulary, the kind's spec) and the trainers' `TrainerSettings` (optimizer, losses).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from specserve.engine.drafters.specs import EagleSpec, KindName, MedusaSpec
from specserve.training.corpus import CorpusSettings


class TrainerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(20, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    medusa_batch_rows: int = Field(256, ge=1)
    medusa_decay: float = Field(0.8, gt=0, description="loss weight of head k: decay ** k")
    eagle_batch_seqs: int = Field(8, ge=1)
    ttt_steps: int = Field(
        1,
        ge=1,
        description="unrolled draft passes trained (EAGLE-3's training-time test); each pass "
        "costs a whole step's compute: at equal time on a 2-core Zen 3, 1 pass made 1.8x the "
        "steps and held-out τ 1.95 against 1.85 for 2 (depth-1 0.44 vs 0.37, deeper lower)",
    )
    reg_weight: float = Field(0.5, ge=0, description="feature regression (smooth L1) weight")
    ce_weight: float = Field(1.0, ge=0, description="token cross-entropy weight")
    soft_labels: bool = Field(
        True,
        description="EAGLE: cross-entropy to the target's whole next-token distribution over the "
        "draft vocabulary (its LM head on the next final feature), as the EAGLE paper trains, "
        "instead of to its argmax token (equal-time A/B on 432 answers: depth-1 acceptance "
        "0.386 -> 0.416, depth 3 0.242 -> 0.294)",
    )
    feature_noise: float = Field(0.05, ge=0, description="uniform noise, times feature std")
    autocast: Literal["auto", "bfloat16", "off"] = Field(
        "auto",
        description="compute the loss under bf16 autocast (fp32 weights and optimizer; on a core "
        "with AMX or avx512_bf16 a step costs a fraction of fp32's); auto: when the target is "
        "served in bf16 or bf16 products measure >= 1.25x faster here (`precision.resolve`)",
    )
    checkpoint_seconds: float = Field(60, gt=0)
    eval_topk: int = Field(8, ge=1)
    eval_depth: int = Field(6, ge=1)
    seed: int = 0


class DrafterTrainSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: KindName
    budget_minutes: float = Field(20.0, gt=0, description="whole command, teacher prefill included")
    corpus: CorpusSettings = CorpusSettings()
    features_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="most of the budget left after the held-out set's prefill that the "
        "training corpus's teacher prefill may take (cached: none)",
    )
    teacher_autocast: Literal["auto", "bfloat16", "off"] = Field(
        "auto",
        description="the training corpus's teacher prefill under bf16 autocast, its features "
        "kept in bf16 (half the cache); the held-out set is always prefilled in the target's own "
        "dtype, so held-out acceptance is scored against the target as served. auto: as "
        "trainer.autocast (on a Zen 4 core an fp32 target's prefill runs ~2x faster)",
    )
    prefill_tokens: int = Field(4096, ge=16, description="padded tokens per prefill batch")
    heldout: int = Field(48, ge=1, description="corpus sequences kept out of training")
    traffic_heldout: float = Field(
        0.25, gt=0, lt=1, description="share of served traffic, the most recent, held out"
    )
    traffic_weight: int = Field(
        4, ge=1, description="each served request trains this many times per epoch"
    )
    traffic_eval_prompts: int = Field(
        24, ge=1, description="held-out served prompts (the most recent) drafters are compared on"
    )
    draft_vocab: int = Field(8192, ge=16)
    eagle_context: int = Field(
        16,
        ge=1,
        description="prompt tokens kept before each answer in EAGLE training rows (their rows "
        "cost compute but train only the feature regression; at equal time on a 2-core Zen 3, "
        "16 against 64: held-out τ 1.90 vs 1.85 with 2 passes, 2.00 vs 1.95 with 1)",
    )
    eval_seconds: float = Field(60, ge=0, description="time reserved for held-out evaluation")
    tau_prompts: int = Field(6, ge=0, description="held-out prompts decoded to measure τ")
    tau_tokens: int = Field(64, ge=1, description="tokens decoded per held-out τ prompt")
    medusa: MedusaSpec = MedusaSpec()
    eagle: EagleSpec = EagleSpec()
    trainer: TrainerSettings = TrainerSettings()
