"""OpenAI's presence / frequency penalties and logit_bias on every verify row, each with its own
prefix: row 0 (the root) sees the output so far, node i's row also the draft path down to node i,
so speculation verifies against exactly the distribution plain decoding would use there."""

from __future__ import annotations

import torch

from specserve.engine.sampling import SamplingParams
from specserve.engine.tree import DraftTree


def prefix_counts(tree: DraftTree, output_ids: list[int], vocab: int) -> torch.Tensor:
    """[n + 1, vocab] token counts of each row's output prefix.

    Example: output [4, 4], a chain [4, 7]: row 0 counts 4 twice, row 1 three times, row 2 also
    counts 7 once.
    """
    counts = torch.zeros(len(tree) + 1, vocab)
    if output_ids:
        counts[0] = torch.bincount(torch.tensor(output_ids), minlength=vocab)[:vocab].float()
    for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
        counts[i + 1] = counts[parent + 1]
        counts[i + 1, token] += 1
    return counts


def penalized(
    logits: torch.Tensor, tree: DraftTree, output_ids: list[int], params: SamplingParams
) -> torch.Tensor:
    """logits [n + 1, vocab] - frequency * count - presence * (count > 0) + logit_bias, per row
    with that row's prefix counts (float32); unchanged when the request sets none of them.

    Example: frequency 0.5, output [3, 3]: token 3's logit drops by 1.0 at the root row.
    """
    if not params.penalized:
        return logits
    vocab = logits.shape[-1]
    out = logits.float().clone()  # [n + 1, vocab]
    if params.frequency_penalty or params.presence_penalty:
        counts = prefix_counts(tree, output_ids, vocab).to(out.device)
        out -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), device=out.device)
        out[:, ids] += torch.tensor(list(params.logit_bias.values()), device=out.device)
    return out
