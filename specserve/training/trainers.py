"""Trainers for Medusa heads and the EAGLE draft layer, with a time budget, a cosine learning
rate over that budget, periodic checkpoints (resume continues where it stopped) and held-out
acceptance rates acc[depth][rank] for the tree budget.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch.nn import functional as F

from specserve.engine import hf_internals
from specserve.engine.drafters.modules import EagleDraft, MedusaHeads, additive_mask
from specserve.training.examples import IGNORE, EagleBatch, MedusaRows, ttt_allowed


def trainable_targets(targets: torch.Tensor) -> torch.Tensor:
    """Targets a loss learns from: out-of-vocabulary ones (negative indices) become IGNORE.
    Example: [3, -1, -100] -> [3, -100, -100]."""
    return targets.masked_fill(targets < 0, IGNORE)


class TrainerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(20, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    medusa_batch_rows: int = Field(256, ge=1)
    medusa_decay: float = Field(0.8, gt=0, description="loss weight of head k: decay ** k")
    eagle_batch_seqs: int = Field(8, ge=1)
    ttt_steps: int = Field(2, ge=1, description="unrolled draft steps trained (EAGLE-3 style)")
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
        "served in bf16 (`train_drafter` resolves it)",
    )
    checkpoint_seconds: float = Field(60, gt=0)
    eval_topk: int = Field(8, ge=1)
    eval_depth: int = Field(6, ge=1)
    seed: int = 0


def _lr(settings: TrainerSettings, step: int, frac: float) -> float:
    """Linear warm-up, then cosine to 10% over the time budget (frac = elapsed / budget).

    Example: lr 1e-3, warm-up done, frac 0.5 -> 1e-3 * (0.1 + 0.9 * 0.5) = 5.5e-4.
    """
    warm = min(1.0, (step + 1) / settings.warmup_steps) if settings.warmup_steps else 1.0
    cos = 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
    return settings.lr * warm * (0.1 + 0.9 * cos)


class Loop:
    """Time-budgeted optimization with checkpoints; `state` persists across resumes."""

    def __init__(self, module, settings: TrainerSettings, budget_s: float, ckpt: Path | None):
        self.module = module
        self.settings = settings
        self.budget_s = budget_s
        self.ckpt = ckpt
        params = [p for p in module.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
        self.state = {
            "step": 0,
            "elapsed": 0.0,
            "epoch": 0,
            "losses": [],
            "heldout_losses": [],  # after each epoch
            "best_epoch": None,
        }
        self.best: dict | None = None  # module state after the best held-out epoch
        if ckpt is not None and ckpt.exists():
            saved = torch.load(ckpt, weights_only=False)
            module.load_state_dict(saved["module"])
            self.opt.load_state_dict(saved["opt"])
            self.state = saved["state"]
            self.best = saved.get("best")

    def save(self) -> None:
        if self.ckpt is None:
            return
        tmp = self.ckpt.with_suffix(".part")
        payload = {"module": self.module.state_dict(), "opt": self.opt.state_dict()}
        torch.save({**payload, "state": self.state, "best": self.best}, tmp)
        tmp.replace(self.ckpt)

    def _score(self, heldout_loss: Callable[[], float] | None) -> None:
        """Score the module on held-out data and remember its state if it is the best."""
        if heldout_loss is None:
            return
        t0 = time.perf_counter()
        self.module.eval()
        with torch.no_grad():
            loss = float(heldout_loss())
        self.module.train()
        self.state["elapsed"] += time.perf_counter() - t0
        self.state["heldout_losses"].append(round(loss, 4))
        if loss <= min(self.state["heldout_losses"]):
            self.state["best_epoch"] = self.state["epoch"]
            self.best = {k: v.detach().clone() for k, v in self.module.state_dict().items()}

    def _precision(self):
        """bf16 autocast on the module's device when the settings ask for it."""
        device = next(self.module.parameters()).device.type
        on = self.settings.autocast == "bfloat16"
        return torch.autocast(device, dtype=torch.bfloat16, enabled=on)

    @property
    def over(self) -> bool:
        return self.state["elapsed"] >= self.budget_s

    def run(
        self,
        batches: Callable[[int], list],
        loss_fn,
        progress=lambda s: None,
        heldout_loss: Callable[[], float] | None = None,
    ) -> dict:
        """Epochs over batches(epoch) until the budget is spent; returns the loop state. With
        `heldout_loss`, each full epoch is scored and the module ends at its best epoch (early
        stopping: small self-distilled sets overfit within minutes)."""
        last_ckpt = time.monotonic()
        while not self.over:
            for batch in batches(self.state["epoch"]):
                if self.over:
                    break
                t0 = time.perf_counter()
                for group in self.opt.param_groups:
                    group["lr"] = _lr(
                        self.settings, self.state["step"], self.state["elapsed"] / self.budget_s
                    )
                with self._precision():
                    loss = loss_fn(batch)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.module.parameters(), 1.0)
                self.opt.step()
                self.state["step"] += 1
                self.state["elapsed"] += time.perf_counter() - t0
                self.state["losses"].append(round(float(loss.detach()), 4))
                progress(self.state)
                if time.monotonic() - last_ckpt > self.settings.checkpoint_seconds:
                    self.save()
                    last_ckpt = time.monotonic()
            else:
                self.state["epoch"] += 1
                self._score(heldout_loss)
                continue
            self._score(heldout_loss)  # the budget ended mid-epoch: score the last state too
        if self.best is not None:
            self.module.load_state_dict(self.best)
        self.save()
        return self.state


# --- Medusa ---------------------------------------------------------------------------------


def medusa_loss(heads: MedusaHeads, rows: torch.Tensor, x, y, decay: float) -> torch.Tensor:
    """Σ_k decay^k · CE(head k logits over the draft vocab, target k); rows [v, H], x [N, H]."""
    out = heads.logits(x, rows)  # [N, K, v]
    y = trainable_targets(y)
    total = x.new_zeros(())
    for k in range(out.shape[1]):
        if (y[:, k] != IGNORE).any():
            total = total + decay**k * F.cross_entropy(out[:, k], y[:, k], ignore_index=IGNORE)
    return total


def train_medusa(
    heads, rows_w, data: MedusaRows, settings, budget_s, ckpt=None, progress=None, heldout=None
):
    """rows_w [v, H]: the frozen LM head's draft-vocabulary rows (own heads start from them);
    heldout (MedusaRows) picks the best epoch."""
    if heads.head is not None and not (ckpt is not None and ckpt.exists()):
        with torch.no_grad():
            heads.head.copy_(rows_w.expand_as(heads.head))
    heads.train()
    loop = Loop(heads, settings, budget_s, ckpt)
    n = len(data.features)

    def batches(epoch: int):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(settings.seed + epoch))
        size = settings.medusa_batch_rows
        return [perm[i : i + size] for i in range(0, n, size)]

    dev = rows_w.device

    def loss_fn(idx):
        x, y = data.features[idx].to(dev), data.targets[idx].to(dev)
        return medusa_loss(heads, rows_w, x, y, settings.medusa_decay)

    def heldout_loss():
        x, y = heldout.features.to(dev), heldout.targets.to(dev)
        return medusa_loss(heads, rows_w, x, y, settings.medusa_decay)

    state = loop.run(
        batches, loss_fn, progress or (lambda s: None), heldout_loss if heldout else None
    )
    heads.eval()
    return state


@torch.no_grad()
def medusa_accept_rates(heads, rows_w, data: MedusaRows, topk: int) -> list[list[float]]:
    """acc[k][r]: fraction of rows where head k's rank-r candidate is the right token
    (r < topk, or fewer when the draft vocabulary is smaller); a token outside the draft
    vocabulary counts as a miss."""
    topk = min(topk, heads.head.shape[1] if heads.head is not None else len(rows_w))
    hits = torch.zeros(data.targets.shape[1], topk)
    counts = torch.zeros(data.targets.shape[1])
    for i in range(0, len(data.features), 1024):
        out = heads.logits(data.features[i : i + 1024].to(rows_w.device), rows_w)  # [n, K, v]
        k = min(topk, out.shape[-1])  # a tiny draft vocabulary has fewer candidates than topk
        top = out.topk(k, dim=-1).indices.cpu()  # [n, K, k]
        y = data.targets[i : i + 1024]
        ok = y != IGNORE
        hits[:, :k] += ((top == y[..., None]) & ok[..., None]).sum(0).float()
        counts += ok.sum(0).float()
    return (hits / counts.clamp(min=1)[:, None]).tolist()


# --- EAGLE ----------------------------------------------------------------------------------


def eagle_unrolled(
    draft: EagleDraft,
    target,
    embed,
    batch: EagleBatch,
    steps: int,
    noise: float,
    std: torch.Tensor | None = None,
):
    """Outputs [steps] of h~ [b, n, H]: pass 1 from the target's features (plus noise), pass j
    from pass j - 1's outputs shifted by one position, over a cache of the earlier passes
    (`ttt_allowed`). Row t of pass j drafts token t + 2 at tree depth j."""
    batch = batch.to(draft.fc.weight.device)
    b, n = batch.next_tokens.shape
    dtype = draft.fc.weight.dtype
    e = embed(batch.next_tokens).to(dtype)  # [b, n, H]
    g = draft.input_feature(batch.feats.to(dtype))  # [b, n, H]
    if noise and std is not None:
        g = g + (torch.rand_like(g) * 2 - 1) * noise * std
    pos = torch.arange(n, device=e.device)[None].expand(b, n)
    cache = hf_internals.empty_cache()
    outs = []
    for step in range(1, steps + 1):
        allowed = ttt_allowed(n, step).to(e.device)
        mask = additive_mask(allowed, dtype)[None, None].expand(b, 1, -1, -1)
        h = draft(e, g, mask, pos, target, cache)
        outs.append(h)
        g = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)  # shift: row t uses h_{t-1}
    return outs


def eagle_loss(outs, batch: EagleBatch, rows_w, settings: TrainerSettings) -> torch.Tensor:
    batch = batch.to(rows_w.device)
    total = outs[0].new_zeros(())
    for j, h in enumerate(outs):  # pass j + 1: valid from row j on
        valid = batch.valid.clone()
        valid[:, :j] = False
        tgt = trainable_targets(batch.targets)
        tgt[:, :j] = IGNORE
        if settings.reg_weight and valid.any():
            reg = F.smooth_l1_loss(h[valid], batch.next_final[valid].to(h.dtype))
            total = total + settings.reg_weight * reg
        if settings.ce_weight and (tgt != IGNORE).any():
            scored = tgt != IGNORE
            logits = h[scored] @ rows_w.T  # [m, v]
            if settings.soft_labels:
                teacher = batch.next_final[scored].to(h.dtype) @ rows_w.T  # [m, v]
                ce = soft_cross_entropy(logits, teacher)
            else:
                ce = F.cross_entropy(logits, tgt[scored])
            total = total + settings.ce_weight * ce
    return total


def soft_cross_entropy(logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Mean over rows of -Σ_v softmax(teacher)_v · log softmax(logits)_v; [m, v] each.

    Example: logits [[0, 0]], teacher [[0, 0]] -> -(0.5 log 0.5 + 0.5 log 0.5) = log 2 ≈ 0.693;
    a teacher with one entry far above the rest gives the ordinary cross-entropy to that entry.
    """
    p = teacher_logits.softmax(dim=-1)
    return -(p * logits.log_softmax(dim=-1)).sum(dim=-1).mean()


def train_eagle(
    draft,
    target,
    rows_w,
    batches_all: list[EagleBatch],
    settings,
    budget_s,
    ckpt=None,
    progress=None,
    std=None,
    heldout: list[EagleBatch] | None = None,
):
    draft.train()
    embed = target.get_input_embeddings()
    loop = Loop(draft, settings, budget_s, ckpt)

    def batches(epoch: int):
        order = list(range(len(batches_all)))
        random.Random(settings.seed + epoch).shuffle(order)
        return [batches_all[i] for i in order]

    def loss_fn(batch):
        outs = eagle_unrolled(
            draft, target, embed, batch, settings.ttt_steps, settings.feature_noise, std
        )
        return eagle_loss(outs, batch, rows_w, settings)

    def heldout_loss():
        total = 0.0
        for batch in heldout:
            outs = eagle_unrolled(draft, target, embed, batch, settings.ttt_steps, 0.0)
            total += float(eagle_loss(outs, batch, rows_w, settings))
        return total / len(heldout)

    state = loop.run(
        batches, loss_fn, progress or (lambda s: None), heldout_loss if heldout else None
    )
    draft.eval()
    return state


@torch.no_grad()
def eagle_accept_rates(draft, target, rows_w, batches: list[EagleBatch], depth: int, topk: int):
    """acc[d][r] over held-out pairs: rank-r candidate of unrolled pass d + 1 is the token (a
    token outside the draft vocabulary counts as a miss)."""
    topk = min(topk, len(rows_w))
    embed = target.get_input_embeddings()
    hits = torch.zeros(depth, topk)
    counts = torch.zeros(depth)
    for batch in batches:
        outs = eagle_unrolled(draft, target, embed, batch, depth, 0.0)
        for j, h in enumerate(outs):
            tgt = batch.targets.to(h.device).clone()
            tgt[:, :j] = IGNORE
            ok = tgt != IGNORE
            k = min(topk, rows_w.shape[0])  # a tiny draft vocabulary has fewer candidates
            top = (h[ok] @ rows_w.T).topk(k, dim=-1).indices  # [m, k]
            hits[j, :k] += (top == tgt[ok][:, None]).sum(0).float().cpu()
            counts[j] += ok.sum().cpu()
    return (hits / counts.clamp(min=1)[:, None]).tolist()
