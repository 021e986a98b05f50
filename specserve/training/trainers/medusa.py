"""Medusa heads' trainer: the decayed sum of each head's cross-entropy over the draft vocabulary,
and held-out acceptance rates acc[head][rank] for the tree budget.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from specserve.engine.drafters.modules import MedusaHeads
from specserve.training.examples import IGNORE, MedusaRows
from specserve.training.trainers.loop import Loop, trainable_targets


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
