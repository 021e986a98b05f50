"""The batched forward's input layout and padding: pure layout checks against the single-request
layout, and padded batches that give every row exactly its unpadded logits."""

from __future__ import annotations

import copy

import pytest
import torch

from specserve.engine import hf_internals
from specserve.engine.forward.batch import verify_batch_forward
from specserve.engine.forward.batch_cache import BatchKV
from specserve.engine.forward.batch_rows import BatchRow, batch_width, build_batch_inputs, padded_q
from specserve.engine.forward.single import verify_forward
from specserve.engine.tree import Draft, DraftTree


def test_layout_example_from_the_docstring():
    """Rows of width 1 and 2 writing at columns 2 and 3: q = 2; row 0's padding query sees its
    2 held columns and itself only; row 1's draft token its past, pending token and itself."""
    visible = torch.tensor([[True, True, False, False, False], [False, True, True, False, False]])
    rows = [
        BatchRow(2, [7], Draft()),
        BatchRow(2, [8], Draft(DraftTree((9,), (-1,)))),
    ]
    assert batch_width(rows) == 2 and batch_width(rows, pad_to=3) == 3
    inputs = build_batch_inputs(rows, visible, [2, 3], 2)
    assert inputs.input_ids.tolist() == [[7, 0], [8, 9]]
    assert inputs.position_ids.tolist() == [[2, 2], [2, 3]]
    assert inputs.allowed[0, 0].tolist() == [True, True, True, False, False]
    assert inputs.allowed[0, 1].tolist() == [True, True, False, True, False]
    assert inputs.allowed[1, 1].tolist() == [False, True, True, True, True]
    assert inputs.logit_rows == [[0], [0, 1]]


def test_padded_q_lands_only_on_exact_cheap_widths():
    cheap = {2: 4, 3: 5, 16: 20, 4: 4}
    width = lambda k: cheap.get(k, k)
    one = BatchRow(0, [1], Draft())
    assert padded_q([one, one], width) == 2  # [2, 2] costs less than [2, 1]
    assert padded_q([one] * 3, width) == 1  # 5 is not 3 x q
    assert padded_q([one] * 16, width) == 1
    assert padded_q([one] * 2, None) == 0


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


@pytest.mark.parametrize("ragged", [False, True], ids=["common-end", "ragged"])
@pytest.mark.parametrize("row_attention", [False, True], ids=["sdpa", "row-attention"])
def test_three_steps_of_a_ragged_batch_equal_each_row_alone(tiny_llama, ragged, row_attention):
    """Rows of lengths 3, 9 and 5 with drafts, three batched steps (keeping the first pending
    row and a draft node that is not a prefix, so holes appear): each step's logits equal the
    row's own single-request forward, written after its own end or the common one, with the
    row-wise attention or plain sdpa."""
    model = tiny_llama(3)
    if row_attention:
        model = copy.deepcopy(model)
        assert hf_internals.enable_row_attention(model)
    prompts = [[5, 6, 7], [3, 1, 4, 1, 5, 9, 2, 6, 5], [2, 7, 1, 8, 2]]
    kv = BatchKV(model.config, ragged=ragged)
    singles, tokens = [], []
    for prompt in prompts:
        cache = hf_internals.new_cache(model.config)
        verify_forward(model, cache, 0, prompt[:-1], Draft())
        kv.add(cache, len(prompt) - 1)
        single = hf_internals.new_cache(model.config)
        verify_forward(model, single, 0, prompt[:-1], Draft())
        singles.append(single)
        tokens.append(list(prompt))
    for step in range(3):
        drafts = [Draft(DraftTree((11 + step, 12, 13), (-1, -1, 0))) for _ in prompts]
        rows = [BatchRow(len(t) - 1, t[-1:], d) for t, d in zip(tokens, drafts, strict=True)]
        outs = verify_batch_forward(model, kv, rows)
        for b, (out, row) in enumerate(zip(outs, rows, strict=True)):
            past = hf_internals.cache_length(singles[b])
            ref = verify_forward(model, singles[b], past, row.pending, row.draft)
            torch.testing.assert_close(out.tree_logits, ref.tree_logits, rtol=1e-5, atol=1e-5)
            kv.keep(b, [0, 1 + 1])  # pending token and draft node 1 (not node 0): a hole
            hf_internals.keep_rows(singles[b], past, [0, 1 + 1])
            tokens[b] += [12, 20 + step]
