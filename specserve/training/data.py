"""Self-distillation data: the target answers training prompts (batched, left-padded greedy
generation), and teacher forcing over its own answers gives the features drafters learn from.

`DistillData` is saved after every generated batch, so an interrupted run resumes where it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specserve.engine import hf_internals


@dataclass
class DistillData:
    """prompt + answer token ids per example; answers stop after the first EOS."""

    prompts: list[list[int]]
    answers: list[list[int] | None]  # None: not generated yet
    max_new_tokens: int
    source: str
    seconds: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def done(self) -> list[int]:
        return [i for i, a in enumerate(self.answers) if a is not None]

    def sequence(self, i: int) -> list[int]:
        return self.prompts[i] + (self.answers[i] or [])

    def save(self, path: Path) -> None:
        tmp = Path(path).with_suffix(".part")
        torch.save(self.__dict__, tmp)
        tmp.replace(path)

    @staticmethod
    def load(path: Path) -> DistillData:
        return DistillData(**torch.load(path, weights_only=False))


def left_pad(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [b, T] and attention mask [b, T], left-padded to the longest.

    Example: [[5, 6], [7]] with pad 0 -> ids [[5, 6], [0, 7]], mask [[1, 1], [0, 1]].
    """
    width = max(len(s) for s in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, seq in enumerate(batch):
        ids[r, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[r, width - len(seq) :] = 1
    return ids, mask


def cut_answer(ids: list[int], eos_ids: frozenset[int]) -> list[int]:
    """Up to and including the first EOS. Example: [4, 2, 9] with eos {2} -> [4, 2]."""
    for i, t in enumerate(ids):
        if t in eos_ids:
            return ids[: i + 1]
    return ids


@torch.inference_mode()
def generate_answers(
    model,
    data: DistillData,
    eos_ids: frozenset[int],
    batch_size: int,
    save_to: Path | None = None,
    deadline: float | None = None,
    progress: Callable[[int], object] = lambda n: None,
) -> DistillData:
    """Fill missing answers by greedy batched `generate()`, prompts of similar length together;
    stops early (answers stay None) at `deadline` (time.monotonic())."""
    todo = sorted(
        (i for i, a in enumerate(data.answers) if a is None), key=lambda i: len(data.prompts[i])
    )
    pad = min(eos_ids) if eos_ids else 0
    for start in range(0, len(todo), batch_size):
        if deadline is not None and time.monotonic() > deadline:
            break
        t0 = time.perf_counter()
        idx = todo[start : start + batch_size]
        ids, mask = left_pad([data.prompts[i] for i in idx], pad)
        out = model.generate(
            ids.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=data.max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(eos_ids) or None,
            pad_token_id=pad,
        )
        for r, i in enumerate(idx):
            data.answers[i] = cut_answer(out[r, ids.shape[1] :].tolist(), eos_ids)
        data.seconds += time.perf_counter() - t0
        if save_to is not None:
            data.save(save_to)
        progress(len(idx))
    return data


@torch.inference_mode()
def teacher_features(
    model,
    sequences: list[list[int]],
    layers: tuple[int, ...],
    batch_size: int = 8,
    deadline: float | None = None,
) -> list[torch.Tensor | None]:
    """Per sequence, features [T, len(layers), H] (float32, CPU) of a causal forward over it
    (right-padded batches; padding never reaches a real row under the causal mask). Batches go
    shortest first; past `deadline` (time.monotonic()) no batch after the first starts and the
    sequences not reached get None."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    by_index: dict[int, torch.Tensor] = {}
    for start in range(0, len(order), batch_size):
        if start and deadline is not None and time.monotonic() > deadline:
            break
        idx = order[start : start + batch_size]
        width = max(len(sequences[i]) for i in idx)
        ids = torch.zeros((len(idx), width), dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, : len(sequences[i])] = torch.tensor(sequences[i])
            mask[r, : len(sequences[i])] = 1
        res = model(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            output_hidden_states=True,
            logits_to_keep=1,
        )
        feats = hf_internals.hidden_features(res, layers)  # [b, T, L, H]
        for r, i in enumerate(idx):
            by_index[i] = feats[r, : len(sequences[i])].float().cpu()
    return [by_index.get(i) for i in range(len(sequences))]


def token_counts(sequences: list[list[int]], vocab_size: int) -> torch.Tensor:
    """[vocab] occurrence counts."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        counts += torch.bincount(torch.tensor(seq, dtype=torch.long), minlength=vocab_size)[
            :vocab_size
        ]
    return counts


def frequent_vocab(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` most frequent token ids (all seen ones if fewer), sorted ascending.

    Example: counts [0, 5, 2, 9], size 2 -> [1, 3].
    """
    seen = int((counts > 0).sum())
    top = counts.topk(min(size, seen)).indices
    return top.sort().values
