"""The draft vocabulary: the rows of the target's frozen LM head a drafter scores.

A drafter scores its artifact's frequent tokens plus the request's prompt tokens (text is often
copied from the prompt) instead of the whole vocabulary: on a CPU the full LM head costs a
quarter of a target forward. Drafting fewer tokens never changes the output, only τ.
"""

from __future__ import annotations

import torch


def request_vocab(
    draft_vocab: torch.Tensor, prompt_ids: list[int], vocab_size: int
) -> torch.Tensor:
    """Sorted unique ids of the draft vocabulary and the prompt, within the model's vocab.

    Example: draft_vocab [5, 1], prompt [1, 9, 200], vocab_size 100 -> [1, 5, 9].
    """
    prompt = torch.tensor(prompt_ids, dtype=torch.long, device=draft_vocab.device)
    ids = torch.unique(torch.cat([draft_vocab.long(), prompt]))
    return ids[(ids >= 0) & (ids < vocab_size)]


def head_rows(target, ids: torch.Tensor) -> torch.Tensor:
    """[v, H]: the target LM head's weight rows of `ids` (the LM head has no bias here)."""
    head = target.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("drafter: LM heads with a bias are not supported")
    return head.weight.detach().index_select(0, ids.to(head.weight.device))
