"""Acceptance rules against slow reference implementations written here."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats

from specserve.engine.tree import DraftTree
from specserve.engine.verify import greedy_accept, greedy_tokens, sample_accept

# ---------------------------------------------------------------------------- greedy


def ref_greedy_accept(tree: DraftTree, target: list[int]) -> tuple[list[int], int]:
    """Enumerate every root-to-node path; keep the longest whose tokens all match the target
    argmax at their parent (0 = root, i + 1 = node i); the bonus is the argmax at its end."""
    best: list[int] = []
    for node in range(len(tree)):
        path = []
        j = node
        while j >= 0:
            path.append(j)
            j = tree.parents[j]
        path.reverse()
        rows = [0] + [n + 1 for n in path[:-1]]
        if all(tree.tokens[n] == target[r] for n, r in zip(path, rows)) and len(path) > len(best):
            best = path
    bonus = target[best[-1] + 1] if best else target[0]
    return best, bonus


def test_greedy_docstring_example():
    tree = DraftTree.from_chains([[5, 6], [7]])
    assert greedy_accept(tree, [7, 9, 8, 4]) == ([2], 4)
    assert greedy_accept(tree, [5, 6, 3, 0]) == ([0, 1], 3)
    assert greedy_accept(tree, [1, 6, 3, 0]) == ([], 1)


def test_greedy_empty_tree():
    assert greedy_accept(DraftTree(), [11]) == ([], 11)


def _random_chains(rng: random.Random, vocab: int, max_chains: int = 6, max_len: int = 6):
    return [
        [rng.randrange(vocab) for _ in range(rng.randrange(1, max_len + 1))]
        for _ in range(rng.randrange(1, max_chains + 1))
    ]


def _synthetic_targets(rng: random.Random, tree: DraftTree, vocab: int, follow: float):
    """Target argmax per row; with probability `follow` it copies one of the row's children, so
    long paths get accepted."""
    target = []
    for slot in range(len(tree) + 1):
        kids = tree.children[slot]
        if kids and rng.random() < follow:
            target.append(tree.tokens[rng.choice(kids)])
        else:
            target.append(rng.randrange(vocab))
    return target


@pytest.mark.parametrize("vocab", [2, 3, 5, 50])
def test_greedy_matches_reference_on_random_tries(vocab):
    rng = random.Random(vocab)
    longest = 0
    for _ in range(400):
        tree = DraftTree.from_chains(_random_chains(rng, vocab))
        target = _synthetic_targets(rng, tree, vocab, follow=rng.choice([0.3, 0.8, 1.0]))
        got = greedy_accept(tree, target)
        assert got == ref_greedy_accept(tree, target), (tree, target)
        longest = max(longest, len(got[0]))
    assert longest >= 4  # the random cases did exercise deep acceptance


def test_greedy_matches_reference_on_random_parent_arrays():
    """Arbitrary topological orders (not only from_chains'), sibling tokens distinct."""
    rng = random.Random(7)
    for _ in range(400):
        n = rng.randrange(0, 14)
        parents, tokens = [], []
        used: dict[int, set[int]] = {}
        for i in range(n):
            p = rng.randrange(-1, i)
            free = [t for t in range(6) if t not in used.setdefault(p, set())]
            if not free:
                p, free = i - 1, list(range(6))  # make it a child of the previous node instead
                free = [t for t in free if t not in used.setdefault(p, set())]
            tok = rng.choice(free)
            used[p].add(tok)
            parents.append(p)
            tokens.append(tok)
        tree = DraftTree(tuple(tokens), tuple(parents))
        target = _synthetic_targets(rng, tree, 6, follow=0.9)
        assert greedy_accept(tree, target) == ref_greedy_accept(tree, target)


def test_greedy_duplicate_sibling_tokens_takes_longest_path():
    # sampled drafts may repeat a token among siblings: the longest matching path wins
    # nodes: 0 = token 5 (leaf), 1 = token 5, 2 = token 6 under node 1
    tree = DraftTree((5, 5, 6), (-1, -1, 1))
    target = [5, 9, 6, 3]  # root -> 5, node 1 -> 6, node 2 -> 3
    assert greedy_accept(tree, target) == ref_greedy_accept(tree, target) == ([1, 2], 3)


# ---------------------------------------------------------------------------- sampling
VOCAB = 6
P_ROOT = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.07, 0.03])


def _first_token(tree: DraftTree, probs: torch.Tensor, seed: int) -> int:
    accepted, bonus = sample_accept(tree, probs, torch.Generator().manual_seed(seed))
    return tree.tokens[accepted[0]] if accepted else bonus


def _assert_matches(counts: np.ndarray, p: np.ndarray, tv_bound: float = 0.02) -> None:
    p = np.asarray(p, dtype=np.float64)
    p = p / p.sum()
    n = counts.sum()
    tv = 0.5 * np.abs(counts / n - p).sum()
    assert tv < tv_bound, (counts / n, p)
    keep = p > 0
    assert counts[~keep].sum() == 0, "drew a token the target gives probability 0"
    pval = stats.chisquare(counts[keep], p[keep] * n).pvalue
    assert pval > 1e-3, (counts / n, p, pval)


@pytest.mark.parametrize(
    "siblings",
    [
        [[1]],  # one likely draft
        [[5]],  # one unlikely draft
        [[1], [0]],
        [[4, 2], [2, 0], [0, 1]],  # three siblings with children (ignored for the first token)
    ],
    ids=["one", "one-unlikely", "two", "three"],
)
def test_sample_accept_first_token_is_target_distributed_deterministic(siblings):
    tree = DraftTree.from_chains(siblings)
    probs = torch.full((len(tree) + 1, VOCAB), 1.0 / VOCAB)
    probs[0] = P_ROOT
    n = 12_000
    counts = np.bincount([_first_token(tree, probs, s) for s in range(n)], minlength=VOCAB)
    _assert_matches(counts, P_ROOT.numpy())


@pytest.mark.parametrize("k", [1, 2, 3])
def test_sample_accept_first_token_is_target_distributed_with_draft_probs(k):
    """Sibling tokens drawn i.i.d. from an explicit, badly matched draft distribution q."""
    q = torch.tensor([0.05, 0.1, 0.1, 0.5, 0.05, 0.2])
    rng = np.random.default_rng(k)
    n = 12_000
    draws = rng.choice(VOCAB, size=(n, k), p=q.numpy())
    probs = P_ROOT.expand(k + 1, VOCAB).clone()
    out = []
    for seed in range(n):
        tree = DraftTree(tuple(int(t) for t in draws[seed]), (-1,) * k, q.expand(k, VOCAB))
        out.append(_first_token(tree, probs, seed))
    _assert_matches(np.bincount(out, minlength=VOCAB), P_ROOT.numpy())


def test_sample_accept_docstring_example():
    tree = DraftTree.from_chains([[0]])
    probs = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    outs = Counter()
    for seed in range(2000):
        accepted, bonus = sample_accept(tree, probs, torch.Generator().manual_seed(seed))
        outs[(tuple(accepted), bonus)] += 1
        if not accepted:
            assert bonus == 1  # the residual removed the rejected token 0
    assert set(outs) <= {((0,), 0), ((0,), 1), ((), 1)}
    rejected = outs[((), 1)] / 2000
    assert abs(rejected - 0.5) < 0.05


def test_sample_accept_point_masses():
    tree = DraftTree.from_chains([[2, 3]])
    probs = torch.zeros(3, 5)
    probs[0, 2] = probs[1, 3] = probs[2, 4] = 1.0
    for seed in range(20):
        assert sample_accept(tree, probs, torch.Generator().manual_seed(seed)) == ([0, 1], 4)
    probs[0] = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0])
    for seed in range(20):
        assert sample_accept(tree, probs, torch.Generator().manual_seed(seed)) == ([], 1)


# ---------------------------------------------------------------- analytic reference


def _residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    r = np.clip(p - q, 0.0, None)
    return r / r.sum() if r.sum() > 0 else p


def ref_raw_outputs(tree, draft_q, target, slot=0, ctx=()) -> dict[tuple[int, ...], float]:
    """Exact distribution of (accepted tokens..., bonus) under recursive rejection sampling:
    at each node try the children in order, accepting x with min(1, p(x) / q(x)), otherwise
    p <- normalize(max(p - q, 0)); the bonus comes from the final residual."""
    p = target(ctx)
    mass = 1.0
    out: dict[tuple[int, ...], float] = {}
    for child in tree.children[slot]:
        x = tree.tokens[child]
        q = draft_q(child)
        a = min(1.0, p[x] / q[x]) if q[x] > 0 else 0.0
        if a > 0:
            for rest, pr in ref_raw_outputs(tree, draft_q, target, child + 1, ctx + (x,)).items():
                out[(x,) + rest] = out.get((x,) + rest, 0.0) + mass * a * pr
        mass *= 1.0 - a
        p = _residual(p, q)
    for b in range(len(p)):
        if p[b] > 0:
            out[(b,)] = out.get((b,), 0.0) + mass * p[b]
    return out


def _extend(raw: dict, target, length: int) -> dict[tuple[int, ...], float]:
    """Sequence distribution of the first `length` tokens when decoding continues from the
    target after the step (the quantity lossless speculation must preserve)."""
    out: dict[tuple[int, ...], float] = {}
    stack = list(raw.items())
    while stack:
        seq, pr = stack.pop()
        if len(seq) >= length:
            out[seq[:length]] = out.get(seq[:length], 0.0) + pr
            continue
        p = target(seq)
        stack.extend((seq + (t,), pr * p[t]) for t in range(len(p)) if p[t] > 0)
    return out


def _target_joint(target, vocab: int, length: int) -> dict[tuple[int, ...], float]:
    out = {}
    for seq in itertools.product(range(vocab), repeat=length):
        pr = 1.0
        for i, t in enumerate(seq):
            pr *= target(seq[:i])[t]
        out[seq] = pr
    return out


def _synthetic_target(vocab: int, seed: int, alpha: float = 0.6):
    """A fixed random next-token distribution per context (with some exact zeros)."""
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def target(ctx):
        if ctx not in cache:
            rng = np.random.default_rng([seed, len(ctx), *ctx])
            p = rng.dirichlet([alpha] * vocab)
            p[p < 0.03] = 0.0
            cache[ctx] = p / p.sum()
        return cache[ctx]

    return target


def _node_contexts(tree):
    ctxs = []
    for i in range(len(tree)):
        p = tree.parents[i]
        ctxs.append((ctxs[p] if p >= 0 else ()) + (tree.tokens[i],))
    return ctxs


def _probs_tensor(tree, target):
    rows = [target(())] + [target(c) for c in _node_contexts(tree)]
    return torch.tensor(np.stack(rows), dtype=torch.float32)


def _assert_dist_close(a: dict, b: dict, tol: float = 1e-9):
    keys = set(a) | set(b)
    worst = max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)
    assert worst < tol, worst


@pytest.mark.parametrize("seed", range(12))
def test_reference_rrs_is_lossless_for_deterministic_trees(seed):
    vocab, length = 4, 3
    rng = random.Random(seed)
    target = _synthetic_target(vocab, seed)
    tree = DraftTree.from_chains(_random_chains(rng, vocab, max_chains=5, max_len=3))

    def one_hot(node):
        q = np.zeros(vocab)
        q[tree.tokens[node]] = 1.0
        return q

    raw = ref_raw_outputs(tree, one_hot, target)
    assert abs(sum(raw.values()) - 1.0) < 1e-9
    _assert_dist_close(_extend(raw, target, length), _target_joint(target, vocab, length))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_reference_rrs_is_lossless_with_draft_probs(k):
    """Root siblings drawn i.i.d. from q (all assignments enumerated, weighted by q), each with a
    deterministic child: the output averaged over drafts equals the target exactly."""
    vocab, length = 4, 2
    target = _synthetic_target(vocab, 100 + k)
    q = np.array([0.1, 0.6, 0.05, 0.25])
    total: dict[tuple[int, ...], float] = {}
    for draws in itertools.product(range(vocab), repeat=k):
        weight = float(np.prod(q[list(draws)]))
        tokens, parents = [], []
        for x in draws:
            tokens += [x, int(np.argmax(target((x,))))]
            parents += [-1, len(tokens) - 2]
        tree = DraftTree(tuple(tokens), tuple(parents))

        def draft_q(node, tree=tree):
            if tree.parents[node] < 0:
                return q
            one = np.zeros(vocab)
            one[tree.tokens[node]] = 1.0
            return one

        for seq, pr in _extend(ref_raw_outputs(tree, draft_q, target), target, length).items():
            total[seq] = total.get(seq, 0.0) + weight * pr
    _assert_dist_close(total, _target_joint(target, vocab, length))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sample_accept_matches_reference_rrs(seed):
    """The implementation's raw outputs (accepted path + bonus) follow the analytic reference."""
    vocab = 4
    rng = random.Random(seed)
    target = _synthetic_target(vocab, 50 + seed, alpha=1.5)
    tree = DraftTree.from_chains(_random_chains(rng, vocab, max_chains=4, max_len=3))
    probs = _probs_tensor(tree, target)

    def one_hot(node):
        q = np.zeros(vocab)
        q[tree.tokens[node]] = 1.0
        return q

    raw = ref_raw_outputs(tree, one_hot, target)
    n = 8000
    seen = Counter()
    for s in range(n):
        accepted, bonus = sample_accept(tree, probs, torch.Generator().manual_seed(s))
        assert all(tree.parents[b] == a for a, b in zip([-1] + accepted, accepted))
        seen[tuple(tree.tokens[i] for i in accepted) + (bonus,)] += 1
    assert set(seen) <= set(raw), set(seen) - set(raw)
    keys = sorted(raw)
    expected = np.array([raw[k] for k in keys])
    observed = np.array([seen[k] for k in keys])
    assert max(len(k) for k in seen) >= 2  # some draft tokens got accepted
    assert 0.5 * np.abs(observed / n - expected).sum() < 0.04
    # pool cells with tiny expectation so the chi-square approximation holds
    big = expected * n >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum()) * n
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3


def test_greedy_tokens_is_argmax_with_first_index_on_ties():
    # worked example: row 0 ties at 1 and 3 (first: 1); row 1's maximum is last
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0], [0.5, -1.0, 0.0, 3.0]])
    assert greedy_tokens(logits) == [1, 3]
    # slow reference: argmax, on tie-heavy rows (few distinct values) and on row views
    generator = torch.Generator().manual_seed(0)
    for width in (5, 49152):
        rows = torch.randint(0, 3, (12, width), generator=generator).float()
        assert greedy_tokens(rows) == rows.argmax(dim=-1).tolist()
        assert greedy_tokens(rows[3:7]) == rows[3:7].argmax(dim=-1).tolist()
        half = rows.bfloat16()  # the serving dtype: its float32 values are exact
        assert greedy_tokens(half) == half.argmax(dim=-1).tolist()
        with torch.inference_mode():  # as the engine calls it
            assert greedy_tokens(rows[:, ::2] + 0) == rows[:, ::2].argmax(dim=-1).tolist()
