"""The shared training loop: the module ends at its best held-out epoch (kept across a resume) and
the learning-rate schedule's worked example."""

from __future__ import annotations

import pytest
import torch

from specserve.training.settings import TrainerSettings
from specserve.training.trainers.loop import Loop, _lr


def test_loop_keeps_the_best_heldout_epoch(tmp_path):
    """Held-out loss rises after the second epoch: the module ends in its epoch-2 state."""
    torch.manual_seed(0)
    module = torch.nn.Linear(2, 1)
    x, y = torch.randn(16, 2), torch.randn(16, 1)
    seen: list[torch.Tensor] = []
    scores = iter([3.0, 1.0, 2.0, 5.0, 6.0, 7.0, 8.0, 9.0] + [10.0] * 1000)

    def heldout():
        seen.append(module.weight.detach().clone())
        return next(scores)

    settings = TrainerSettings(lr=1e-2, warmup_steps=0)
    loop = Loop(module, settings, budget_s=0.3, ckpt=tmp_path / "c.pt")
    state = loop.run(
        lambda epoch: [0, 1], lambda i: ((module(x) - y) ** 2).mean(), heldout_loss=heldout
    )
    assert state["best_epoch"] == 2 and state["heldout_losses"][:3] == [3.0, 1.0, 2.0]
    assert len(seen) > 3
    assert torch.equal(module.weight, seen[1])
    resumed = Loop(torch.nn.Linear(2, 1), settings, budget_s=0.3, ckpt=tmp_path / "c.pt")
    assert resumed.state["best_epoch"] == 2 and resumed.best is not None


def test_loop_best_epoch_on_losses_that_round_down(tmp_path):
    """Each held-out loss is lower than the last but rounds down at 4 decimals (9.80283 ->
    9.8028): every epoch is the best in turn, and the module ends in its last scored state."""
    module = torch.nn.Linear(2, 1)
    x, y = torch.randn(16, 2), torch.randn(16, 1)
    seen: list[torch.Tensor] = []
    scores = iter([9.80283 - 0.1 * i for i in range(10_000)])

    def heldout():
        seen.append(module.weight.detach().clone())
        return next(scores)

    loop = Loop(module, TrainerSettings(lr=1e-2, warmup_steps=0), budget_s=0.2, ckpt=None)
    state = loop.run(
        lambda epoch: [0, 1], lambda i: ((module(x) - y) ** 2).mean(), heldout_loss=heldout
    )
    assert len(seen) >= 2 and state["best_epoch"] is not None
    assert torch.equal(module.weight, seen[-1])


def test_lr_schedule_example():
    s = TrainerSettings(lr=1e-3, warmup_steps=0)
    assert _lr(s, 100, 0.5) == pytest.approx(5.5e-4)
