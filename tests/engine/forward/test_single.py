"""The verify forward: layout of the query rows, and logits equal to plain causal forwards."""

from __future__ import annotations

import random
from contextlib import contextmanager

import pytest
import torch

from specserve.engine import hf_internals
from specserve.engine.forward.inputs import additive_mask, build_inputs, window_allowed
from specserve.engine.forward.single import verify_forward
from specserve.engine.proposers.lookahead import window_layout
from specserve.engine.tree import AuxBranch, Draft, DraftTree

ATOL = 1e-5


def test_build_inputs_docstring_example():
    a, b, x = 11, 12, 13
    inp = build_inputs(3, [a, b], Draft(DraftTree.from_chains([[x]])))
    assert inp.input_ids.tolist() == [[a, b, x]]
    assert inp.position_ids.tolist() == [[3, 4, 5]]
    assert inp.logit_rows.tolist() == [1, 2]
    assert inp.allowed.tolist() == [
        [True, True, True, True, False, False],
        [True, True, True, True, True, False],
        [True, True, True, True, True, True],
    ]


def test_build_inputs_tree_and_aux_layout():
    tree = DraftTree.from_chains([[5, 6], [7]])  # nodes 0:5, 1:6 (under 0), 2:7
    offsets, visible = window_layout(2, 2)
    aux = AuxBranch((20, 21, 22, 23), tuple(offsets), visible, (2, 3))
    inp = build_inputs(2, [9], Draft(tree, aux))
    assert inp.input_ids.tolist() == [[9, 5, 6, 7, 20, 21, 22, 23]]
    root = 2
    assert inp.position_ids.tolist() == [[2, 3, 4, 3, 3, 4, 4, 5]]
    assert inp.logit_rows.tolist() == [0, 1, 2, 3, 6, 7]
    al = inp.allowed
    assert al.shape == (8, 10)
    assert al[:, : root + 1].all()  # everyone sees the cache and the pending root
    tree_block = al[1:4, 3:6]
    assert torch.equal(tree_block, tree.ancestor_mask())
    assert not al[1:4, 6:].any()  # tree rows never see aux
    assert not al[4:, 3:6].any()  # aux rows never see the tree
    assert torch.equal(al[4:, 6:], visible)
    assert not al[0, 3:].any()


def test_build_inputs_empty_draft_is_plain_causal_prefill():
    inp = build_inputs(0, [1, 2, 3, 4], Draft())
    assert inp.position_ids.tolist() == [[0, 1, 2, 3]]
    assert torch.equal(inp.allowed, torch.ones(4, 4, dtype=torch.bool).tril())
    assert inp.logit_rows.tolist() == [3]


@torch.inference_mode()
def _plain_last_logits(model, tokens: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([tokens])).logits[0, -1]


@contextmanager
def _capture_logits(model):
    seen = []
    handle = model.register_forward_hook(lambda m, i, o: seen.append(o.logits[0].clone()))
    try:
        yield seen
    finally:
        handle.remove()


def _node_paths(tree: DraftTree) -> list[list[int]]:
    paths: list[list[int]] = []
    for i, p in enumerate(tree.parents):
        paths.append((paths[p] if p >= 0 else []) + [tree.tokens[i]])
    return paths


def _aux_context(aux: AuxBranch, row: int) -> list[int]:
    """The aux tokens row `row` sees, ordered by position; they must fill offsets 1..k."""
    seen = [j for j in range(len(aux)) if aux.visible[row, j]]
    seen.sort(key=lambda j: aux.offsets[j])
    assert [aux.offsets[j] for j in seen] == list(range(1, len(seen) + 1))
    assert seen[-1] == row
    return [aux.tokens[j] for j in seen]


CASES = [
    # (seed, prompt len, cached prefix len, chains, window, levels)
    (0, 1, 0, [[3, 4, 5]], 0, 0),
    (1, 9, 0, [[3, 4, 5], [3, 6], [8]], 0, 0),
    (2, 9, 6, [[3, 4, 5], [3, 6], [8]], 3, 2),
    (3, 30, 29, [[1, 1, 1, 1], [1, 2], [2, 1, 1]], 4, 3),
    (4, 12, 4, [], 5, 4),
    (5, 20, 10, [[7] * 6, [7, 8, 9, 10], [11]], 1, 1),
    (6, 2, 1, [[0, 1], [1, 0], [2]], 2, 3),
]


@pytest.mark.parametrize("seed, n_prompt, n_cached, chains, window, levels", CASES)
def test_tree_and_aux_logits_equal_plain_forwards(
    model, seed, n_prompt, n_cached, chains, window, levels
):
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    prompt = [rng.randrange(vocab) for _ in range(n_prompt)]
    tree = DraftTree.from_chains(chains)
    aux = None
    if window:
        offsets, visible = window_layout(window, levels)
        n_aux = window * levels
        aux = AuxBranch(
            tokens=tuple(rng.randrange(vocab) for _ in range(n_aux)),
            offsets=tuple(offsets),
            visible=visible,
            logit_rows=tuple(range(n_aux)),  # read every aux row, not just the top level
        )
    cache = hf_internals.new_cache(model.config)
    if n_cached:
        with torch.inference_mode():
            model(
                input_ids=torch.tensor([prompt[:n_cached]]),
                **hf_internals.cache_kwargs(model, cache),
                use_cache=True,
            )
    with _capture_logits(model) as seen:
        out = verify_forward(model, cache, n_cached, prompt[n_cached:], Draft(tree, aux))
    n = len(tree)
    assert out.tree_logits.shape == (n + 1, vocab)
    assert hf_internals.cache_length(cache) == n_prompt + n + (len(aux) if aux else 0)

    # root = last prompt token; node i = prompt + its path
    expected = [_plain_last_logits(model, prompt)]
    expected += [_plain_last_logits(model, prompt + path) for path in _node_paths(tree)]
    for row, want in enumerate(expected):
        assert torch.allclose(out.tree_logits[row], want, atol=ATOL), (
            row,
            (out.tree_logits[row] - want).abs().max(),
        )

    if aux:
        (all_logits,) = seen
        aux_logits = all_logits[n + 1 :]
        assert aux_logits.shape[0] == len(aux)
        for r in range(len(aux)):
            want = _plain_last_logits(model, prompt + _aux_context(aux, r))
            assert torch.allclose(aux_logits[r], want, atol=ATOL), (
                r,
                (aux_logits[r] - want).abs().max(),
            )
        assert out.aux_tokens == aux_logits.argmax(-1).tolist()
    else:
        assert out.aux_tokens == []


def test_aux_tokens_are_argmax_at_the_top_level(model):
    """As the lookahead proposer uses it: logit rows = the top level only."""
    rng = random.Random(3)
    prompt = [rng.randrange(96) for _ in range(15)]
    offsets, visible = window_layout(3, 2)
    toks = tuple(rng.randrange(96) for _ in range(6))
    aux = AuxBranch(toks, tuple(offsets), visible, (3, 4, 5))
    cache = hf_internals.new_cache(model.config)
    out = verify_forward(model, cache, 0, prompt, Draft(DraftTree.from_chains([[1, 2]]), aux))
    want = [
        int(_plain_last_logits(model, prompt + _aux_context(aux, r)).argmax()) for r in (3, 4, 5)
    ]
    assert out.aux_tokens == want


@torch.inference_mode()
def test_features_of_pending_and_tree_rows_equal_plain_forwards(model):
    """Each tree node's feature is the one a plain causal forward over its path gives."""
    prefix = [4, 8, 15, 16, 23]
    tree = DraftTree.from_chains([[42, 7, 9], [42, 11], [3]])
    cache = hf_internals.new_cache(model.config)
    verify_forward(model, cache, 0, prefix[:3], Draft())
    out = verify_forward(
        model, cache, 3, prefix[3:], Draft(tree), pad_to=12, feature_layers=(0, -1)
    )
    assert out.features.shape == (2 + len(tree), 2, model.config.hidden_size)

    def plain(tokens):
        res = model(input_ids=torch.tensor([tokens]), output_hidden_states=True)
        return hf_internals.hidden_features(res, (0, -1))[0, -1]  # [2, H]

    assert torch.allclose(out.features[0], plain(prefix[:4]), atol=1e-5)
    assert torch.allclose(out.features[1], plain(prefix), atol=1e-5)
    for node, path in enumerate(_node_paths(tree)):
        tokens = prefix + path
        assert torch.allclose(out.features[2 + node], plain(tokens), atol=1e-5)
    assert verify_forward(model, cache, 5, [1], Draft()).features is None


def test_additive_mask_docstring_example():
    mask = additive_mask(torch.tensor([[True, False]]), torch.float32, "cpu")
    assert mask.tolist() == [[0.0, torch.finfo(torch.float32).min]]
    assert additive_mask(torch.tensor([[False]]), torch.bfloat16, "cpu").dtype == torch.bfloat16


def test_window_allowed_docstring_example():
    allowed = torch.tensor([[True, True, True]])
    out = window_allowed(allowed, torch.tensor([3]), torch.tensor([1, 2, 3]), 2)
    assert out.tolist() == [[False, True, True]]


def test_window_allowed_equals_a_loop_over_every_pair():
    """Slow reference: transformers' rule kv > q - window, pair by pair, on a batch."""
    gen = torch.Generator().manual_seed(0)
    allowed = torch.rand(2, 5, 9, generator=gen) < 0.7
    query_pos = torch.randint(0, 20, (2, 5), generator=gen)
    key_pos = torch.randint(0, 20, (2, 9), generator=gen)
    out = window_allowed(allowed, query_pos, key_pos, 4)
    for b in range(2):
        for i in range(5):
            for j in range(9):
                near = bool(key_pos[b, j] > query_pos[b, i] - 4)
                assert out[b, i, j].item() == (bool(allowed[b, i, j]) and near)
