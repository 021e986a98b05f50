"""The lossless contract outside fp32: an output may differ from `ar` only at a numerical tie.

A divergence is a tie when, in a plain forward over the common prefix (serving dtype), both
tokens are within `tolerance` of the top logit; the tolerance is measured, not chosen: the
largest change of a top-token logit gap between 1-row and k-row forwards of the same prefix.
"""

from __future__ import annotations

import random

import torch
from pydantic import BaseModel

from specserve.engine import hf_internals
from specserve.engine.forward.single import verify_forward
from specserve.engine.lora.batch import lora_rows
from specserve.engine.prompts import calibration_prompts, encode_prompt
from specserve.engine.tree import Draft, DraftTree


def first_divergence(reference: list[int], other: list[int]) -> int | None:
    """The first index where two outputs differ (a shorter one differs at its end), else None.

    Example: ([5, 6, 7], [5, 6, 8]) -> 2; ([5, 6], [5, 6, 9]) -> 2; ([5], [5]) -> None.
    """
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


def tie_gap(logits: torch.Tensor, token_a: int, token_b: int) -> float:
    """How far the weaker of two tokens is below the top logit (0: both are the argmax).

    logits [vocab]. Example: logits [1.0, 3.0, 2.875], tokens 1 and 2 -> 0.125; tokens 1 and 0 ->
    2.0 (token 0 is no contender).
    """
    top = float(logits.max())
    return top - min(float(logits[token_a]), float(logits[token_b]))


def gap_noise(x: torch.Tensor, y: torch.Tensor, top: int = 5) -> float:
    """Largest change, between two computations x and y of the same rows, of the gap between any
    two of x's `top` tokens: the logit noise that can flip a near-tie.

    x, y [rows, vocab]. Example: x [[4.0, 3.0, 0.0]], y [[4.0, 3.25, 0.0]], top 2 -> 0.25.
    """
    x, y = x.float(), y.float()
    idx = x.topk(min(top, x.shape[-1]), dim=-1).indices  # [rows, top]
    xs, ys = x.gather(-1, idx), y.gather(-1, idx)  # [rows, top]
    dx = xs[:, :, None] - xs[:, None, :]  # [rows, top, top]
    dy = ys[:, :, None] - ys[:, None, :]
    return float((dx - dy).abs().max()) if dx.numel() else 0.0


@torch.inference_mode()
def plain_logits(model, ids: list[int], adapter: str | None = None) -> torch.Tensor:
    """[len(ids), vocab] float32 logits of one cache-free causal forward (the model's own path)."""
    input_ids = torch.tensor([ids], device=model.device)
    with lora_rows(model, [adapter]):
        out = model(input_ids=input_ids, use_cache=False)
    return out.logits[0].float()


def _incremental_and_block(model, ids: list[int], k: int, adapter: str | None):
    """Logits of the last k positions of `ids` computed one row per forward, and in one k-row
    verify forward, both after the same prefill of ids[:-k]. Returns two [k, vocab] tensors."""
    prefix, tail = ids[:-k], ids[-k:]
    rows = []
    cache = hf_internals.new_cache(model.config)
    verify_forward(model, cache, 0, prefix, Draft(), adapter=adapter)
    for i, token in enumerate(tail):
        out = verify_forward(model, cache, len(prefix) + i, [token], Draft(), adapter=adapter)
        rows.append(out.tree_logits[0])
    cache = hf_internals.new_cache(model.config)
    verify_forward(model, cache, 0, prefix, Draft(), adapter=adapter)
    chain = DraftTree(tuple(tail[1:]), tuple(range(-1, k - 2)))
    block = verify_forward(model, cache, len(prefix), tail[:1], Draft(chain), adapter=adapter)
    return torch.stack(rows).float(), block.tree_logits.float()


def tolerance_sequences(tokenizer, vocab_size: int, count: int = 6) -> list[list[int]]:
    """Sequences the tolerance is measured on: calibration prompts (Python's docs, never benchmark
    data) cut to 160 tokens, and two seeded random-token ones (logits far from any such text)."""
    sequences = [encode_prompt(tokenizer, p)[:160] for p in calibration_prompts(count)[:count]]
    rng = random.Random(0)
    return sequences + [[rng.randrange(vocab_size) for _ in range(120)] for _ in range(2)]


class TieTolerance(BaseModel):
    tolerance: float  # the largest gap noise seen
    by_width: dict[int, float]  # k -> largest gap noise between 1-row and k-row forwards
    vs_plain: float  # largest gap noise between incremental 1-row and a cache-free forward
    sequences: int
    dtype: str


def measure_tolerance(
    model, sequences: list[list[int]], widths=(2, 4, 8, 16), adapter: str | None = None
) -> TieTolerance:
    """Gap noise between incremental, k-row and cache-free forwards of the same sequences."""
    by_width = {k: 0.0 for k in widths}
    vs_plain = 0.0
    for ids in sequences:
        plain = plain_logits(model, ids, adapter)
        for k in widths:
            if len(ids) <= k:
                continue
            single, block = _incremental_and_block(model, ids, k, adapter)
            by_width[k] = max(by_width[k], gap_noise(single, block), gap_noise(block, single))
            vs_plain = max(vs_plain, gap_noise(single, plain[-k:]))
    tolerance = max([vs_plain, *by_width.values()])
    return TieTolerance(
        tolerance=round(tolerance, 6),
        by_width={k: round(v, 6) for k, v in by_width.items()},
        vs_plain=round(vs_plain, 6),
        sequences=len(sequences),
        dtype=str(model.dtype),
    )


class Divergence(BaseModel):
    question_id: int
    position: int  # index into the output where it first differs from ar
    ar_token: int | None  # None: ar's output ended there
    token: int | None
    tie_gap: float | None  # see `tie_gap`, from a plain forward over prompt + common output
    top2_gap: float  # the plain forward's top-1 minus top-2 logit there
    tie: bool


class DivergenceCheck(BaseModel):
    identical: bool
    divergences: list[Divergence]
    max_tie_gap: float | None  # over divergences; None when identical
    tolerance: float
    all_ties: bool


def check_outputs(
    model,
    prompts: dict[int, list[int]],
    reference: dict[int, list[int]],
    outputs: dict[int, list[int]],
    tolerance: float,
    adapter: str | None = None,
) -> DivergenceCheck:
    """Compare each output with the reference (`ar`) output of the same prompt id."""
    found = []
    for qid, ref in reference.items():
        out = outputs[qid]
        pos = first_divergence(ref, out)
        if pos is None:
            continue
        logits = plain_logits(model, prompts[qid] + ref[:pos], adapter)[-1]  # [vocab]
        top2 = logits.topk(2).values
        a = ref[pos] if pos < len(ref) else None
        b = out[pos] if pos < len(out) else None
        gap = tie_gap(logits, a, b) if a is not None and b is not None else None
        found.append(
            Divergence(
                question_id=qid,
                position=pos,
                ar_token=a,
                token=b,
                tie_gap=None if gap is None else round(gap, 6),
                top2_gap=round(float(top2[0] - top2[1]), 6),
                tie=gap is not None and gap <= tolerance,
            )
        )
    gaps = [d.tie_gap for d in found if d.tie_gap is not None]
    return DivergenceCheck(
        identical=not found,
        divergences=found,
        max_tie_gap=max(gaps) if gaps else None,
        tolerance=tolerance,
        all_ties=all(d.tie for d in found),
    )
