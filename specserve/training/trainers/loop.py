"""The loop every drafter trainer runs: a time budget, a cosine learning rate over that budget,
periodic checkpoints (resume continues where it stopped) and early stopping on held-out loss.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from specserve.training.examples import IGNORE
from specserve.training.settings import TrainerSettings


def trainable_targets(targets: torch.Tensor) -> torch.Tensor:
    """Targets a loss learns from: out-of-vocabulary ones (negative indices) become IGNORE.
    Example: [3, -1, -100] -> [3, -100, -100]."""
    return targets.masked_fill(targets < 0, IGNORE)


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
        self.state["heldout_losses"].append(round(loss, 4))  # for the manifest
        # decided on the unrounded loss: against the rounded list a loss that rounds down
        # (9.80283 -> 9.8028) would never count as the best
        if loss <= self.state.get("best_loss", float("inf")):
            self.state["best_loss"] = loss
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
