"""The hybrid proposer: one tree from EAGLE, prompt lookup and the pool. Its load cut by worked
examples (its budget: test_draft_budget.py); its merge by what it must reduce to; its output
equal to `ar` with and without a drafter; per-source attribution adding up."""

from __future__ import annotations

import random

import pytest

from specserve.engine.ngram_pool import NGramPool
from specserve.engine.proposers.base import ProposerContext
from specserve.engine.proposers.draft_trie import tree_paths as _paths
from specserve.engine.proposers.hybrid import HybridConfig, HybridProposer, limit
from specserve.engine.sampling import SamplingParams
from specserve.engine.tree import Draft, DraftTree

pytestmark = pytest.mark.timeout(180)


def test_limit_worked_example():
    cfg = HybridConfig(budget=12)  # 2 x 2 window: 4 aux rows
    small = limit(cfg, 6)
    assert small.budget == 6 and small.window is None
    mid = limit(cfg, 10)
    assert mid.window is not None and mid.budget == 6  # 4 window rows + 6 nodes


def _proposer(prompt, pool=None, **cfg) -> HybridProposer:
    ctx = ProposerContext(list(prompt), vocab_size=96, seed=0, pool=pool)
    return HybridProposer(HybridConfig.model_validate({"window": None, **cfg}), ctx)


def test_shared_prefixes_share_nodes():
    """A prompt match and a pool continuation starting alike become one branch."""
    pool = NGramPool()
    prompt = [1, 2, 3, 4, 9, 1]  # "1" was followed by 2 3 4 9 1
    proposer = _proposer(prompt, pool, pool_draft_len=3)
    pool.add((1,), (2, 3, 7))  # after the prompt's own n-grams: most recent first
    tree = proposer.propose(prompt).tree
    assert _paths(tree) >= {(2,), (2, 3), (2, 3, 4), (2, 3, 7)}
    assert tree.tokens.count(2) == 1  # one node for the shared first token


def test_the_budget_goes_to_the_better_measured_source():
    pool = NGramPool()
    prompt = [1, 2, 3, 4, 9, 1]
    for _ in range(50):  # the pool's drafts were accepted; the prompt's 1-token matches were not
        pool.match_stats.record("pool", 2, 2)
        pool.match_stats.record("prompt:1", 2, 0)
    proposer = _proposer(prompt, pool, budget=2, pool_draft_len=2, pool_guesses=1)
    pool.add((1,), (5, 6))  # after the prompt's own n-grams: the most recent
    proposer.prompt.config = proposer.prompt.config.model_copy(update={"max_ngram": 1})
    tree = proposer.propose(prompt).tree
    assert tree.tokens == (5, 6) and tree.parents == (-1, 0)


def test_counts_prefer_the_continuation_seen_most_often():
    """After "1" the prompt shows 2 three times and 5 once (the most recent): prompt lookup
    drafts 5 first; counts keep 2 (3 / (4 + 2) against 1 / 6), or both wherever scored alike."""
    prompt = [1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 5, 0, 1]
    counted = _proposer(prompt, budget=1, pool_guesses=0)
    assert counted.propose(prompt).tree.tokens == (2,)
    measured = _proposer(prompt, budget=1, pool_guesses=0, counts=None)
    assert measured.propose(prompt).tree.tokens == (5,)


def test_a_request_counts_what_followed_in_the_variants_other_outputs():
    pool = NGramPool()
    first = _proposer([1, 2, 3], pool)
    first.observe(first.propose([1, 2, 3]), [], [1, 2, 3, 40, 41, 42, 43])  # its output, indexed
    second = _proposer([9, 40], pool, pool_guesses=0)
    draft = second.propose([9, 40])
    assert (41, 42, 43) in _paths(draft.tree)  # 40 was followed by 41 42 43 in that output
    second.observe(draft, [], [9, 40, 41, 42, 99])
    assert second.accepted_by_source == {"eagle": 0, "prompt": 0, "pool": 2}
    alone = _proposer([9, 40], pool, pool_guesses=0, counts={"recent_outputs": 0})
    assert not alone.propose([9, 40]).tree  # its own context has no earlier 40


def test_requests_sharing_a_variants_pool_equal_ar(drafting_engine):
    engine = drafting_engine()
    pool = NGramPool()
    rng = random.Random(7)
    segment = [rng.randrange(96) for _ in range(12)]
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    for i in range(4):
        prompt = segment[i:] + segment[:i] + [rng.randrange(96)]
        got = engine.generate(prompt, params, "hybrid", {"use_drafter": False}, pool=pool)
        assert got.output_ids == engine.generate(prompt, params).output_ids, i
    assert len(pool.outputs) == 4


def test_observe_learns_per_source_and_attributes():
    pool = NGramPool()
    prompt = [1, 2, 3, 4, 9, 1]
    proposer = _proposer(prompt, pool, pool_guesses=0)
    draft = proposer.propose(prompt)
    assert (2, 3, 4) in _paths(draft.tree)
    # the target accepted 2, 3 and then chose 8 (the bonus)
    proposer.observe(draft, [], prompt + [2, 3, 8])
    tried, accepted = pool.match_stats.snapshot()["prompt:1"]
    assert accepted[:2] == [1, 1] and tried[:3] == [1, 1, 1]
    assert proposer.accepted_by_source == {"eagle": 0, "prompt": 2, "pool": 0}


@pytest.mark.parametrize("budget", [1, 4, 10])
def test_reduces_to_eagle_without_ngram_matches(drafting_engine, budget):
    """With no n-gram source able to match and the gate off, the merged tree is EAGLE-2's own:
    same trees, so the same forwards and acceptance, step for step."""
    engine = drafting_engine()
    rng = random.Random(budget)
    prompt = rng.sample(range(96), 40)  # distinct tokens; prompt lookup needs 30-token repeats
    params = SamplingParams(max_new_tokens=24)
    eagle_cfg = {"depth": 3, "topk": 3, "total_tokens": budget}
    hybrid_cfg = {
        "budget": budget,
        "window": None,
        "pool_guesses": 0,
        "prompt": {"min_ngram": 30, "max_ngram": 30},
        "eagle": {"depth": 3, "topk": 3},
        "gate": {"enabled": False},  # EAGLE every step, as `eagle` runs it
        "calibrate": False,  # EAGLE's own scores rank the nodes, as `eagle` ranks them
    }
    eagle = engine.generate(prompt, params, "eagle", eagle_cfg)
    hybrid = engine.generate(prompt, params, "hybrid", hybrid_cfg)
    assert hybrid.output_ids == eagle.output_ids == engine.generate(prompt, params).output_ids
    assert hybrid.widths == eagle.widths
    assert hybrid.accepted_by_depth == eagle.accepted_by_depth
    assert set(hybrid.accepted_by_source) == {"eagle", "prompt", "pool"}
    assert hybrid.accepted_by_source["prompt"] == hybrid.accepted_by_source["pool"] == 0


@pytest.mark.parametrize("prompt_len", [3, 30, 120])
@pytest.mark.parametrize("with_drafter", [True, False])
def test_equals_ar_and_attribution_adds_up(drafting_engine, prompt_len, with_drafter):
    engine = drafting_engine()
    rng = random.Random(prompt_len)
    segment = [rng.randrange(96) for _ in range(9)]
    prompt = (segment * (prompt_len // 9 + 1))[:prompt_len]
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    cfg = {"use_drafter": with_drafter, "budget": 10}
    got = engine.generate(prompt, params, "hybrid", cfg)
    assert got.output_ids == engine.generate(prompt, params).output_ids
    # committed draft tokens: every output token but one bonus per forward (the last forward's
    # bonus may have been cut by max_new_tokens)
    bonus_free = len(got.output_ids) - got.forwards
    assert bonus_free <= sum(got.accepted_by_source.values()) <= bonus_free + 1
    if not with_drafter:
        assert got.accepted_by_source["eagle"] == 0
    if prompt_len >= 30:
        assert got.tau > 1.1  # drafts are accepted: the equality is not that of empty drafts


def test_the_gate_skips_a_drafter_that_adds_nothing_and_output_stays_ar(drafting_engine):
    """A random drafter's tokens are rarely accepted, so after its warm-up the gate runs it only
    every `explore`-th step; the draft cache catches up on the features it skipped (one pass),
    and the output is still `ar`'s."""
    engine = drafting_engine()
    rng = random.Random(5)
    segment = [rng.randrange(96) for _ in range(9)]
    prompt = (segment * 4)[:30]
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    cfg = {"budget": 10, "gate": {"warmup": 2, "explore": 3}}
    state = engine.start(prompt, params, "hybrid", cfg)
    proposer = state.proposer
    proposer.gate.record_tokens(0, 0)  # as if measured: it added nothing and cost as much
    proposer.gate.record_cost(1.0, 1.0)
    for _ in engine.stream(state):
        pass
    assert state.output_ids == engine.generate(prompt, params).output_ids
    assert proposer.gate.skipped >= 5 and proposer.eagle.committed > 0


def test_the_window_gate_drops_rows_the_pool_does_not_repay(drafting_engine):
    """On a linear cost curve every window row costs a full forward; when the pool's nodes add
    little, the window runs only on exploring steps, and the output is still `ar`'s."""
    engine = drafting_engine()
    prompt = random.Random(7).sample(range(96), 40)  # distinct tokens: little to look up
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    linear = {w: float(w) for w in (1, 2, 4, 8, 16, 32)}
    cfg = {
        "budget": 4,
        "use_drafter": False,
        "relative_cost": linear,
        "window": {"window": 2, "ngram": 3, "guesses": 0},
        "gate": {"warmup": 1, "explore": 4},
    }
    state = engine.start(prompt, params, "hybrid", cfg)
    for _ in engine.stream(state):
        pass
    assert state.output_ids == engine.generate(prompt, params).output_ids
    gate = state.proposer.window_gate
    assert gate.skipped >= gate.steps // 2


def test_rows_share_worked_example():
    """EAGLE's gate prices the verify rows its nodes add: 8 rows (root + 7 nodes), 4 of them
    EAGLE's, on costs {4: 1.0, 8: 1.25} -> 1 - 1.0 / 1.25 = 0.2; without a curve, 0."""
    proposer = _proposer([1, 2, 3], relative_cost={4: 1.0, 8: 1.25})
    tree = DraftTree(tuple(range(10, 17)), (-1, 0, 1, 2, -1, 4, 5))
    paths = sorted(_paths(tree), key=len)
    proposer._owners = {p: ("eagle" if i < 4 else "prompt") for i, p in enumerate(paths)}
    assert proposer._rows_share(Draft(tree), "eagle") == pytest.approx(0.2)
    assert _proposer([1, 2, 3])._rows_share(Draft(tree), "eagle") == 0.0


def test_calibration_records_each_kept_node_and_its_outcome():
    """Kept nodes 2 > 3 > 4 (a prompt match) and the target accepting 2, 3 then choosing 8:
    2 and 3 count as accepted, 4 not; their raw predictions are what is recorded."""
    pool = NGramPool()
    prompt = [1, 2, 3, 4, 9, 1]
    proposer = _proposer(prompt, pool, pool_guesses=0)
    draft = proposer.propose(prompt)
    kept = dict(proposer._predicted)
    assert {(2,), (2, 3), (2, 3, 4)} <= set(kept)
    proposer.observe(draft, [], prompt + [2, 3, 8])
    accepted = sum(a for _, a in pool.node_calibration.snapshot()["prompt"])
    assert accepted == 2
    predicted = sum(p for p, _ in pool.node_calibration.snapshot()["prompt"])
    assert predicted == pytest.approx(sum(kept.values()), abs=1e-3)


def test_calibration_stops_drafting_what_a_steep_curve_does_not_repay():
    """Prompt matches scored ~0.5-0.8 that were never accepted: on a curve where a second row
    costs 1.6x, the calibrated proposer drafts nothing; without calibration it drafts."""
    prompt = [1, 2, 3, 4, 9, 1, 2, 3, 4, 9, 1]
    steep = {1: 1.0, 2: 1.6, 4: 1.7, 8: 1.9, 16: 2.0}
    pool = NGramPool()
    fresh = _proposer(prompt, pool, pool_guesses=0, relative_cost=steep)
    assert len(fresh.propose(prompt).tree) > 0
    for b in range(3):
        pool.node_calibration.record([("prompt", 0.9 / 2**b, False)] * 200)
    calibrated = _proposer(prompt, pool, pool_guesses=0, relative_cost=steep)
    assert len(calibrated.propose(prompt).tree) == 0
    plain = _proposer(prompt, pool, pool_guesses=0, relative_cost=steep, calibrate=False)
    assert len(plain.propose(prompt).tree) > 0
