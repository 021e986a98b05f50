"""The precision a drafter training computes in: bf16 autocast where the target serves bf16, or
where this device's bf16 products measure clearly faster than its fp32 ones (a Zen 4 or AMX core,
a GPU), else the target's dtype. A drafter's numerics touch only its acceptance, never the output.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Literal

import torch

from specserve.training.settings import DrafterTrainSettings

Precision = Literal["bfloat16", "off"]

# bf16 products this much faster than fp32 ones make autocast worth its rounding
MIN_SPEEDUP = 1.25


@functools.lru_cache(maxsize=8)
def bf16_speedup(device: torch.device, rows: int = 1024, repeats: int = 3) -> float:
    """fp32 / bf16 time of a drafter-sized product ([rows, 576] x [576, 1536]) on `device`,
    the best of `repeats` each (~0.1 s on 2 AMX cores, ~0.65 s on 2 AVX2 cores, where bf16 is
    slow); measured once per process and device."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 576, generator=gen).to(device)
    w = torch.randn(1536, 576, generator=gen).to(device)

    def best(a: torch.Tensor, b: torch.Tensor) -> float:
        (a @ b.T).sum().item()  # warm-up, and a sync point on a GPU
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            (a @ b.T).sum().item()
            times.append(time.perf_counter() - t0)
        return min(times)

    return best(x, w) / best(x.bfloat16(), w.bfloat16())


def resolve(
    setting: Literal["auto", "bfloat16", "off"],
    target_dtype: torch.dtype,
    speedup: Callable[[], float],
) -> Precision:
    """`auto`: bf16 where the target serves bf16, or where `speedup()` (fp32 / bf16 time) is
    at least MIN_SPEEDUP; an explicit setting as given.

    Example: auto, float32 target, speedup 2.4 (Zen 4) -> "bfloat16"; speedup 0.3 (AVX2) -> "off".
    """
    if setting != "auto":
        return setting
    if target_dtype == torch.bfloat16:
        return "bfloat16"
    if target_dtype != torch.float32:
        return "off"
    return "bfloat16" if speedup() >= MIN_SPEEDUP else "off"


def resolved(settings: DrafterTrainSettings, model) -> dict[str, Precision]:
    """The teacher prefill's and the trainer's precision, `auto` resolved (this device's bf16
    speed-up is measured only when an `auto` needs it, once: `bf16_speedup` is cached)."""
    speedup = functools.partial(bf16_speedup, model.device)
    return {
        "teacher": resolve(settings.teacher_autocast, model.dtype, speedup),
        "trainer": resolve(settings.trainer.autocast, model.dtype, speedup),
    }


def with_trainer(settings: DrafterTrainSettings, resolved: Precision) -> DrafterTrainSettings:
    """The settings with the trainer's `autocast` resolved."""
    trainer = settings.trainer.model_copy(update={"autocast": resolved})
    return settings.model_copy(update={"trainer": trainer})
