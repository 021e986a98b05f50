"""Turn corpus sequences and their teacher data into training tensors per drafter kind.

Token targets are the target's own greedy tokens (`greedy[t]`: its argmax after position t), so
a drafter learns what the target would accept even where the corpus text is not the target's.
Medusa: rows (feature at t, greedy[t+1..t+K]). EAGLE: padded sequences of (feature t, token t+1)
pairs with the next final feature and greedy[t+1] as targets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100  # no target here (padding, prompt, past the sequence's end)
OUT_OF_VOCAB = -1  # a target the draft vocabulary cannot name: not trained on, scored as a miss


def vocab_index(draft_vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab] position of each token in the draft vocabulary, OUT_OF_VOCAB outside it.

    Example: draft_vocab [2, 5], vocab_size 6 -> [-1, -1, 0, -1, -1, 1].
    """
    index = torch.full((vocab_size,), OUT_OF_VOCAB, dtype=torch.long)
    index[draft_vocab] = torch.arange(len(draft_vocab))
    return index


@dataclass
class MedusaRows:
    features: torch.Tensor  # [N, H] final feature at t
    targets: torch.Tensor  # [N, K] draft-vocab index of token t + k + 2 (IGNORE: none)


def medusa_rows(
    sequences: list[list[int]],
    prompt_lens: list[int],
    features: list[torch.Tensor],  # each [T, 1, H]
    greedy: list[torch.Tensor],  # each [T]
    heads: int,
    index: torch.Tensor,
) -> MedusaRows:
    """One row per answer position t (P - 1 <= t <= T - 3): features[t] and, for head k, the
    target's greedy token after position t + k + 1. Example: T 5, P 2, K 2 -> rows t = 1, 2 with
    targets greedy[2:4], [greedy[3], greedy[4]]."""
    xs, ys = [], []
    for ids, p, f, g in zip(sequences, prompt_lens, features, greedy):
        t = len(ids)
        g_t = torch.cat([g.long(), torch.zeros(heads + 1, dtype=torch.long)])
        for pos in range(max(p - 1, 0), t - 2):
            xs.append(f[pos, 0])
            tgt = index[g_t[pos + 1 : pos + 1 + heads]].clone()
            beyond = torch.arange(heads) + pos + 1 >= t
            tgt[beyond] = IGNORE
            ys.append(tgt)
    if not xs:
        raise ValueError("medusa: no training rows (answers too short)")
    return MedusaRows(torch.stack(xs).float(), torch.stack(ys))


@dataclass
class EagleBatch:
    feats: torch.Tensor  # [b, n, layers, H] target features at t
    next_tokens: torch.Tensor  # [b, n] token t + 1
    next_final: torch.Tensor  # [b, n, H] target final feature at t + 1 (regression target)
    targets: torch.Tensor  # [b, n] draft-vocab index of token t + 2, IGNORE where not trained
    valid: torch.Tensor  # [b, n] bool: real (non-padding) pair

    def to(self, device) -> EagleBatch:
        return EagleBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def eagle_batch(
    sequences: list[list[int]],
    prompt_lens: list[int],
    features: list[torch.Tensor],  # each [T, layers + 1, H]; the last layer slot is the final
    greedy: list[torch.Tensor],  # each [T]
    index: torch.Tensor,
) -> EagleBatch:
    """Pairs t = 0..T-2 of each sequence, right-padded; token targets greedy[t + 1] only in the
    answer (t + 2 >= P) and inside the sequence (t + 2 < T)."""
    n = max(len(s) for s in sequences) - 1
    b = len(sequences)
    layers = features[0].shape[1] - 1
    hidden = features[0].shape[2]
    feats = torch.zeros(b, n, layers, hidden)
    next_tokens = torch.zeros(b, n, dtype=torch.long)
    next_final = torch.zeros(b, n, hidden)
    targets = torch.full((b, n), IGNORE, dtype=torch.long)
    valid = torch.zeros(b, n, dtype=torch.bool)
    for r, (ids, p, f, g) in enumerate(zip(sequences, prompt_lens, features, greedy)):
        m = len(ids) - 1
        ids_t = torch.tensor(ids, dtype=torch.long)
        feats[r, :m] = f[:m, :layers]
        next_tokens[r, :m] = ids_t[1:]
        next_final[r, :m] = f[1:, layers]
        valid[r, :m] = True
        lo = max(p - 2, 0)
        if m - 1 > lo:
            targets[r, lo : m - 1] = index[g[lo + 1 : m].long()]
    return EagleBatch(feats, next_tokens, next_final, targets, valid)


def eagle_batches(
    sequences: list[list[int]],
    prompt_lens: list[int],
    features: list[torch.Tensor],
    greedy: list[torch.Tensor],
    index: torch.Tensor,
    size: int,
    context: int,
) -> list[EagleBatch]:
    """`eagle_batch`es of `size` sequences of similar length; each sequence keeps `context` prompt
    tokens before its answer (features come from the full sequence, so they are exact; the draft
    just sees less)."""
    cut = [max(p - context, 0) for p in prompt_lens]
    sequences = [s[c:] for s, c in zip(sequences, cut)]
    prompt_lens = [p - c for p, c in zip(prompt_lens, cut)]
    features = [f[c:] for f, c in zip(features, cut)]
    greedy = [g[c:] for g, c in zip(greedy, cut)]
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out = []
    for s in range(0, len(order), size):
        idx = order[s : s + size]
        out.append(
            eagle_batch(
                [sequences[i] for i in idx],
                [prompt_lens[i] for i in idx],
                [features[i] for i in idx],
                [greedy[i] for i in idx],
                index,
            )
        )
    return out


def ttt_allowed(n: int, step: int) -> torch.Tensor:
    """[n, n * step] bool: what row t of unrolled pass `step` (1-based) attends to, over the
    rows of passes 1..step laid out pass-major. Pass 1 is causal; pass j row t sees pass-1 rows
    s <= t - j + 1 (the committed context) and pass-i row t - j + i for i = 2..j (its draft
    ancestors and itself), as a depth j - 1 tree node does at inference.

    Example: n 3, step 2: row 2 sees pass-1 rows 0, 1 and pass-2 row 2.
    """
    allowed = torch.zeros(n, n * step, dtype=torch.bool)
    for t in range(n):
        allowed[t, : max(t - step + 2, 0)] = True
        for i in range(2, step + 1):
            s = t - step + i
            if s >= 0:
                allowed[t, (i - 1) * n + s] = True
        if step == 1:
            allowed[t, : t + 1] = True
    return allowed
