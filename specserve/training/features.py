"""Teacher data by prefill, cached on disk: per corpus sequence, the target's hidden features at
the drafter's layers and its greedy next token at every position.

One directory per (model weights, adapter, dtype, layers), entries keyed by each sequence's tokens;
each batch is saved as it is done, so an interrupted extraction resumes and a second training (any
kind, any budget, a grown or reshuffled corpus) prefills only the sequences it has not seen.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specserve.engine import hf_internals


@dataclass(frozen=True)
class Teacher:
    """Per sequence (None: not reached within the deadline)."""

    features: list[torch.Tensor | None]  # each [T, layers, H], the target's dtype (autocast: bf16)
    greedy: list[torch.Tensor | None]  # each [T] long: the target's argmax after position t


def cache_key(
    weights: str,
    adapter: str | None,
    dtype: torch.dtype,
    layers,
    autocast: bool = False,
) -> str:
    """The cache directory's name: what every cached feature depends on besides its tokens."""
    parts = [weights, adapter, str(dtype), list(layers)]
    raw = json.dumps(parts + (["bf16-autocast"] if autocast else []))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def sequence_key(sequence: list[int]) -> str:
    """A sequence's entry in the cache: a digest of its tokens (the same tokens, the same key)."""
    return hashlib.sha256(json.dumps(sequence).encode()).hexdigest()[:24]


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped shortest first, each group's padded size (rows x longest) <= batch_tokens
    (a longer sequence goes alone).

    Example: lengths [5, 2, 3], batch_tokens 6 -> [[1, 2], [0]] (2 x 3 = 6, then 5).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[i] <= batch_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


@torch.inference_mode()
def prefill(model, sequences: list[list[int]], layers: tuple[int, ...], autocast: bool = False):
    """One right-padded causal forward: per sequence (features [T, L, H], greedy [T]). With
    `autocast` the forward runs under bf16 autocast and its features are kept in bf16."""
    width = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)  # [b, T]
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for r, seq in enumerate(sequences):
        ids[r, : len(seq)] = torch.tensor(seq)
        mask[r, : len(seq)] = 1
    with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=autocast):
        out = model(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            output_hidden_states=True,
        )
    feats = hf_internals.hidden_features(out, layers).cpu()  # [b, T, L, H]
    if autocast:
        feats = feats.to(torch.bfloat16)
    greedy = out.logits.argmax(dim=-1).cpu()  # [b, T]
    return [
        (feats[r, : len(s)].clone(), greedy[r, : len(s)].clone()) for r, s in enumerate(sequences)
    ]


def teacher_data(
    model,
    sequences: list[list[int]],
    layers: tuple[int, ...],
    cache_dir: Path,
    batch_tokens: int = 4096,
    deadline: float | None = None,
    log=lambda msg: None,
    progress=lambda n: None,
    autocast: bool = False,
) -> Teacher:
    """Features and greedy tokens of every sequence, from `cache_dir` where saved, else by
    prefill (shortest first; no batch starts past `deadline`, time.monotonic(); `autocast`: in
    bf16, see `prefill`)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    keys = [sequence_key(s) for s in sequences]
    got = _cached(cache_dir, set(keys))
    todo = [i for i, k in enumerate(keys) if k not in got]
    if got:
        log(f"teacher data: {len(got)} of {len(sequences)} sequences from {cache_dir}")
    started, parts = time.monotonic(), len(list(cache_dir.glob("part-*.pt")))
    for group in length_batches([len(sequences[i]) for i in todo], batch_tokens):
        if deadline is not None and time.monotonic() > deadline:
            break
        idx = [todo[g] for g in group]
        rows = prefill(model, [sequences[i] for i in idx], layers, autocast)
        done = dict(zip([keys[i] for i in idx], rows))
        tmp = cache_dir / f"part-{parts:05d}.part"
        torch.save(done, tmp)
        tmp.replace(tmp.with_suffix(".pt"))
        parts += 1
        got.update(done)
        progress(len(idx))
    if todo:
        log(f"teacher data: {len(got)} sequences ({time.monotonic() - started:.0f}s of prefill)")
    return Teacher(
        [got[k][0] if k in got else None for k in keys],
        [got[k][1] if k in got else None for k in keys],
    )


def _cached(cache_dir: Path, wanted: set[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The saved (features, greedy) of the wanted sequences (others in the directory are skipped)."""
    got: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for part in sorted(cache_dir.glob("part-*.pt")):
        saved = torch.load(part, weights_only=True)
        got.update((k, v) for k, v in saved.items() if k in wanted)
    return got
