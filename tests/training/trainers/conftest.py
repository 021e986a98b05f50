"""Data of the trainer tests: a tiny model's own greedy continuations (self-distillation data) and
their teacher features."""

from __future__ import annotations

import pytest
import torch

from specserve.training.features import prefill


def _teacher(model, seqs, layers):
    """(features, greedy) per sequence, from one prefill."""
    out = prefill(model, seqs, layers)
    return [f.float() for f, _ in out], [g for _, g in out]


def _loopy_data(model, n=24, length=40):
    """Sequences the tiny model generated itself (greedy), as self-distillation data."""
    g = torch.Generator().manual_seed(0)
    seqs = []
    with torch.inference_mode():
        for i in range(n):
            prompt = torch.randint(0, 96, (1, 4), generator=g)
            out = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=length,
                do_sample=False,
                pad_token_id=0,
            )
            seqs.append(out[0].tolist())
    return seqs


@pytest.fixture
def teacher():
    """`teacher(model, seqs, layers) -> (features, greedy)` per sequence."""
    return _teacher


@pytest.fixture
def loopy_data():
    """`loopy_data(model, n=24, length=40)`: sequences the model generated itself (greedy)."""
    return _loopy_data
