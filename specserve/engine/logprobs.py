"""Log-probabilities of committed tokens (OpenAI `logprobs` / `top_logprobs`), read from the rows
of the verify forward: each token under the distribution the verifier drew it from, so they are
exact with speculation (a committed token's row is the row plain decoding would have scored)."""

from __future__ import annotations

import math

import torch
from pydantic import BaseModel, ConfigDict

from specserve.engine.sampling import SamplingParams, target_probs


class TopLogprob(BaseModel):
    """One candidate of a position: a token id and its log-probability."""

    model_config = ConfigDict(frozen=True)

    token_id: int
    logprob: float


class TokenLogprob(BaseModel):
    """A committed token, its log-probability and the position's `top` candidates (most likely
    first, ties by token id; never a token the distribution masks out)."""

    model_config = ConfigDict(frozen=True)

    token_id: int
    logprob: float
    top: list[TopLogprob]


def logprob_rows(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[m, vocab] float32 log-probs of the distribution each row is drawn from: sampled
    (temperature > 0), `log(target_probs(logits, params))` (temperature, top-k and top-p applied;
    masked tokens -inf); greedy, `log_softmax(logits)` (the model's own, temperature 1).

    Example: logits [[2, 1, 0, -9]], top_k 2, temperature 1 -> [-0.313, -1.313, -inf, -inf];
    greedy -> about [-0.408, -1.408, -2.408, -11.408].
    """
    if params.greedy:
        return torch.log_softmax(logits.float(), dim=-1)
    return torch.log(target_probs(logits, params))


def committed_rows(accepted: list[int]) -> list[int]:
    """The verify row each committed token of a step is drawn from: the root row for the first,
    then the row of each accepted node (the last one's draws the bonus). Example: [0, 2] -> [0, 1, 3]."""
    return [0] + [i + 1 for i in accepted]


def token_logprobs(
    rows: torch.Tensor, row_of: list[int], tokens: list[int], k: int
) -> list[TokenLogprob]:
    """Per token: its log-prob in `rows[row_of[j]]` ([n + 1, vocab] log-probs) and that row's top
    `k` finite entries, most likely first, ties by token id.

    Example: a row [-0.5, -1.2, -0.5, -inf], token 1, k 3 -> logprob -1.2, top [(0, -0.5),
    (2, -0.5), (1, -1.2)]; k 5 gives the same three (the masked token is never listed).
    """
    picked = rows[row_of]  # [m, vocab]
    chosen = picked[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)].tolist()
    return [
        TokenLogprob(
            token_id=token,
            logprob=value,
            top=[TopLogprob(token_id=t, logprob=v) for t, v in top],
        )
        for token, value, top in zip(tokens, chosen, _tops(picked, k), strict=True)
    ]


def step_logprobs(
    log_rows: torch.Tensor, accepted: list[int], tokens: list[int], k: int
) -> list[TokenLogprob]:
    """The logprobs of one verify step's committed `tokens` (the accepted path + bonus), read
    from the verifier's log-probs of every row (`log_rows` [n + 1, vocab], as `logprob_rows`
    defines them), with `k` top candidates each."""
    return token_logprobs(log_rows, committed_rows(accepted), tokens, k)


def _tops(rows: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    """Per row the top `k` finite (token id, log-prob), ties by token id: one top-(k + 1) for all
    rows; a row whose finite top values repeat is redone by `_top` (the order of ties)."""
    if k <= 0:
        return [[] for _ in range(rows.shape[0])]
    values, ids = torch.topk(rows, min(k + 1, rows.shape[-1]), dim=-1)  # sorted, descending
    out = []
    for r, (row_values, row_ids) in enumerate(zip(values.tolist(), ids.tolist(), strict=True)):
        finite = [(t, v) for t, v in zip(row_ids, row_values, strict=True) if v != -math.inf]
        if len({v for _, v in finite}) < len(finite):
            finite = _top(rows[r], k)
        out.append(finite[:k])
    return out


def _top(row: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The top `k` finite (token id, log-prob) of a row, ties by token id (ascending)."""
    k = min(k, int(torch.isfinite(row).sum()))
    if k <= 0:
        return []
    kth = torch.topk(row, k).values[-1]
    ids = torch.nonzero(row >= kth).flatten()  # every token tied with the k-th too, ascending
    values, order = torch.sort(row[ids], descending=True, stable=True)
    return list(zip(ids[order[:k]].tolist(), values[:k].tolist(), strict=True))
