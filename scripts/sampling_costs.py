"""What one sampled verify step's rules cost, as ratios from one run (fp32, one thread, vocab
49152, 8 verify rows, best of 30): the inverse-CDF seeded rule against Gumbel-max over the same
probabilities, and top_p against temperature-only processing. Usage: python scripts/sampling_costs.py"""

from __future__ import annotations

import time

import torch

from specserve.engine.sampling import SamplingParams, target_probs
from specserve.engine.seeded import mix, seeded_tokens

VOCAB, ROWS = 49152, 8


def best_ms(fn, runs: int = 30) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def gumbel_max(probs: torch.Tensor) -> torch.Tensor:
    """The alternative design: vocab-sized Gumbel noise keyed by (seed, position) per row."""
    noise = []
    for position in range(probs.shape[0]):
        generator = torch.Generator().manual_seed(mix(1, position))
        u = torch.rand(probs.shape[-1], generator=generator, dtype=torch.float64)
        noise.append(-torch.log(-torch.log(u.clamp(1e-300, 1 - 1e-16))))
    return (torch.log(probs).double() + torch.stack(noise)).argmax(-1)


def main() -> None:
    torch.set_num_threads(1)
    logits = torch.randn(ROWS, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    top_p = SamplingParams(temperature=0.7, top_p=0.9)
    probs = target_probs(logits, top_p)
    inverse = best_ms(lambda: seeded_tokens(probs, 1, list(range(ROWS))))
    gumbel = best_ms(lambda: gumbel_max(probs))
    nucleus = best_ms(lambda: target_probs(logits, top_p))
    plain = best_ms(lambda: target_probs(logits, SamplingParams(temperature=0.7)))
    print(
        f"seeded rule: inverse CDF {inverse:.2f} ms, Gumbel-max {gumbel:.2f} ms "
        f"({gumbel / inverse:.0f}x)"
    )
    print(
        f"target_probs: top_p 0.9 {nucleus:.2f} ms, temperature only {plain:.2f} ms "
        f"({nucleus / plain:.0f}x)"
    )


if __name__ == "__main__":
    main()
