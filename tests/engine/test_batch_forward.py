"""The batched forward's input layout and padding: pure layout checks against the single-request
layout, and padded batches that give every row exactly its unpadded logits."""

from __future__ import annotations

import torch

from specserve.engine import hf_internals
from specserve.engine.batch_cache import BatchKV
from specserve.engine.batch_forward import (
    BatchRow,
    _padded_q,
    build_batch_inputs,
    verify_batch_forward,
)
from specserve.engine.forward import verify_forward
from specserve.engine.tree import Draft, DraftTree


def test_layout_example_from_the_docstring():
    """Rows of width 1 and 2 over visible [[T, T, F], [F, T, T]]: q = 2; row 0's padding query
    sees its 2 held columns and itself only."""
    visible = torch.tensor([[True, True, False], [False, True, True]])
    rows = [
        BatchRow(2, [7], Draft()),
        BatchRow(2, [8], Draft(DraftTree((9,), (-1,)))),
    ]
    inputs = build_batch_inputs(rows, visible)
    assert inputs.input_ids.tolist() == [[7, 0], [8, 9]]
    assert inputs.position_ids.tolist() == [[2, 2], [2, 3]]
    assert inputs.allowed[0, 1].tolist() == [True, True, False, False, True]
    assert inputs.allowed[1, 1].tolist() == [False, True, True, True, True]
    assert inputs.logit_rows == [[0], [0, 1]]


def test_padded_q_lands_only_on_exact_cheap_widths():
    cheap = {2: 4, 3: 5, 16: 20, 4: 4}
    width = lambda k: cheap.get(k, k)
    one = BatchRow(0, [1], Draft())
    assert _padded_q([one, one], width) == 2  # [2, 2] costs less than [2, 1]
    assert _padded_q([one] * 3, width) == 1  # 5 is not 3 x q
    assert _padded_q([one] * 16, width) == 1
    assert _padded_q([one] * 2, None) == 0


def test_padded_batch_rows_equal_each_row_alone(tiny_llama):
    """Two requests with different pasts and drafts, padded to q = 6: each row's logits equal
    the single-request verify forward of that request."""
    model = tiny_llama(0)
    prompts = [[5, 6, 7, 8, 9], [3, 1, 4, 1, 5, 9, 2, 6]]
    drafts = [Draft(DraftTree((11, 12), (-1, 0))), Draft(DraftTree((13,), (-1,)))]
    kv = BatchKV(model.config)
    alone = []
    for prompt, draft in zip(prompts, drafts, strict=True):
        cache = hf_internals.new_cache(model.config)
        verify_forward(model, cache, 0, prompt[:-1], Draft())
        kv.add(cache, len(prompt) - 1)
        single = hf_internals.new_cache(model.config)
        verify_forward(model, single, 0, prompt[:-1], Draft())
        alone.append(verify_forward(model, single, len(prompt) - 1, prompt[-1:], draft))
    rows = [BatchRow(len(p) - 1, p[-1:], d) for p, d in zip(prompts, drafts, strict=True)]
    outs = verify_batch_forward(model, kv, rows, pad_width=lambda k: 12)
    assert kv.columns == 7 + 6
    for out, ref in zip(outs, alone, strict=True):
        torch.testing.assert_close(out.tree_logits, ref.tree_logits, rtol=1e-5, atol=1e-5)
        assert out.tree_logits.argmax(-1).tolist() == ref.tree_logits.argmax(-1).tolist()
