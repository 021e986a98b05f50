"""The EAGLE draft layer's trainer: unrolled draft passes (training-time test), feature
regression plus (soft) cross-entropy, and held-out acceptance rates acc[depth][rank].
"""

from __future__ import annotations

import random

import torch
from torch.nn import functional as F

from specserve.engine import hf_internals
from specserve.engine.drafters.modules import EagleDraft, additive_mask
from specserve.training.examples import IGNORE, EagleBatch, ttt_allowed
from specserve.training.settings import TrainerSettings
from specserve.training.trainers.loop import Loop, trainable_targets


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
    """Over the unrolled passes: smooth L1 to the target's next final feature and (soft)
    cross-entropy to its next token. The teacher's logits are one product for every pass (pass
    j scores a subset of pass 1's rows)."""
    batch = batch.to(rows_w.device)
    targets = trainable_targets(batch.targets)  # [b, n]
    first = targets != IGNORE  # [b, n]: rows pass 1 scores
    teacher = None  # [m, v] over pass 1's scored rows
    if settings.ce_weight and settings.soft_labels and first.any():
        teacher = batch.next_final[first].to(outs[0].dtype) @ rows_w.T
    total = outs[0].new_zeros(())
    for j, h in enumerate(outs):  # pass j + 1: valid from row j on
        valid = batch.valid.clone()
        valid[:, :j] = False
        scored = first.clone()
        scored[:, :j] = False
        if settings.reg_weight and valid.any():
            reg = F.smooth_l1_loss(h[valid], batch.next_final[valid].to(h.dtype))
            total = total + settings.reg_weight * reg
        if settings.ce_weight and scored.any():
            logits = h[scored] @ rows_w.T  # [m_j, v]
            if teacher is not None:
                ce = soft_cross_entropy(logits, teacher[scored[first]])
            else:
                ce = F.cross_entropy(logits, targets[scored])
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
