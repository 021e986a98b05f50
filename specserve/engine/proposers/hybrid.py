"""`hybrid`: one draft tree per step from every source a request has — EAGLE's dynamic tree (when
a drafter is given), prompt-lookup matches over prompt + output, and the variant's n-gram pool
(fed by a Lookahead window) — merged into one trie under one token budget.

Every node is scored as the probability that verification accepts it: EAGLE's path confidence;
for a continuation, how often it followed the recent occurrences of the matched suffix in the
context and the variant's other outputs (continuations.py, output_index.py); for a pool chain
(or, without counts, a prompt match), the product of its source's measured per-depth acceptance
(`MatchStats`, shared per variant); each score then scaled by how often verified nodes of its
source and score were accepted (`NodeCalibration`, per variant). Nodes are kept best first; with
the device's cost curve the number kept maximizes expected tokens - r x cost, r the tokens per
unit of cost the request has reached (draft_budget.py).
"""

from __future__ import annotations

import math
import time

import torch

from specserve.engine.match_stats import MatchStats, common_prefix
from specserve.engine.proposers.base import REGISTRY, ProposerContext, Strategy
from specserve.engine.proposers.continuations import (
    CountsConfig,
    continuation_counts,
    count_paths,
    path_log_scores,
)
from specserve.engine.proposers.draft_budget import (
    chain_prefix,
    keep_count,
    relative_at,
    step_cost,
)
from specserve.engine.proposers.draft_trie import DraftTrie, tree_paths
from specserve.engine.proposers.eagle import EagleProposer
from specserve.engine.proposers.hybrid_config import HybridConfig
from specserve.engine.proposers.lookahead import LookaheadConfig, LookaheadProposer
from specserve.engine.proposers.prompt_lookup import PromptLookupProposer
from specserve.engine.proposers.source_gate import SourceGate
from specserve.engine.tree import Draft, DraftTree

SOURCES = ("eagle", "prompt", "pool")  # how accepted tokens are attributed


class HybridProposer:
    def __init__(self, config: HybridConfig, ctx: ProposerContext) -> None:
        self.config = config
        self.prompt = PromptLookupProposer(config.prompt)
        window = config.window or LookaheadConfig(window=1, ngram=3, guesses=0)
        self.lookahead = LookaheadProposer(window.model_copy(update={"guesses": 0}), ctx)
        self.pool = self.lookahead.pool
        self.stats: MatchStats = self.pool.match_stats
        self.calibration = self.pool.node_calibration if config.calibrate else None
        self.eagle = (
            EagleProposer(config.eagle, ctx)
            if config.use_drafter and ctx.drafter is not None
            else None
        )
        self.feature_layers = self.eagle.feature_layers if self.eagle else ()
        self.drafter = self.eagle.drafter if self.eagle else None
        self.accepted_by_source = dict.fromkeys(SOURCES, 0)
        self._chains: list[tuple[str, list[int]]] = []  # this step's n-gram chains
        self._owners: dict[tuple[int, ...], str] = {}  # kept path -> its source
        self._predicted: dict[tuple[int, ...], float] = {}  # kept path -> its raw probability
        self._tokens, self._cost = 0, 0.0  # committed tokens and verify cost (curve) so far
        self._step_cost = 1.0  # the last kept draft's cost on the curve
        self._proposed_at = 0
        self.gate = SourceGate(config.gate)  # the EAGLE drafter, priced in seconds
        self.window_gate = SourceGate(config.gate)  # the window's rows, by the cost curve
        self._features: list[torch.Tensor] = []  # committed rows' features not yet drafted from
        self._drafter_s = 0.0  # the drafter's seconds in the last propose (0: it did not run)
        self._eagle_rows_share = 0.0  # the share of the last verify's cost EAGLE's rows made
        self._step_end: float | None = None  # when the last propose returned
        self._output_id = self.pool.outputs.new_id()  # this request's output in the index
        self._indexed = len(ctx.prompt_ids)  # tokens[: _indexed] are prompt or indexed output

    def propose(self, tokens: list[int]) -> Draft:
        self._proposed_at = len(tokens)
        trie = DraftTrie()
        self._chains = self._ngram_chains(tokens)
        for source, chain in self._chains:
            if source == "pool" or self.config.counts is None:
                prior = self.config.pool_prior if source == "pool" else None
                rates = self.stats.rates(source, len(chain), prior)
                trie.add_chain(chain, [math.log(r) for r in rates], source)
        if self.config.counts is not None:
            self._add_continuations(trie, tokens, self.config.counts)
        self._drafter_step(trie, tokens)
        window = self.config.window is not None and self.window_gate.run_now()
        aux = self.lookahead.propose(tokens).aux if window else None
        draft = Draft(self._select(trie, len(aux.tokens) if aux else 0), aux)
        self._step_end = time.perf_counter()
        return draft

    def _drafter_step(self, trie: DraftTrie, tokens: list[int]) -> None:
        """EAGLE's nodes into the trie when the gate says they pay for their time; the step's
        time since the last propose (verify, commit) is recorded first."""
        if self.eagle is None:
            return
        start = time.perf_counter()
        if self._step_end is not None:  # EAGLE's levels, plus the verify rows its nodes added
            rest = start - self._step_end
            self.gate.record_cost(
                self._drafter_s + self._eagle_rows_share * rest,
                (1 - self._eagle_rows_share) * rest,
            )
        self._drafter_s = 0.0
        if not self.gate.run_now():
            return
        if self._features:  # catch the draft cache up on the steps it sat out
            features, self._features = torch.cat(self._features), []
            self.eagle.observe_features(features, tokens)
        self._add_eagle(trie, tokens)
        self._drafter_s = time.perf_counter() - start

    def _ngram_chains(self, tokens: list[int]) -> list[tuple[str, list[int]]]:
        found = self.prompt.matches(tokens, self.prompt.config.max_matches)
        chains = [(f"prompt:{n}", chain) for n, chain in found]
        key_len = self.lookahead.config.key_len
        if self.config.pool_guesses and len(tokens) >= key_len:
            for cont in self.pool.get(tokens[-key_len:], self.config.pool_guesses):
                chains.append(("pool", self._extend(list(cont), key_len)))
        return chains

    def _add_continuations(self, trie: DraftTrie, tokens: list[int], counts: CountsConfig) -> None:
        """Every suffix length's continuation trie, counted over this request's context and the
        variant's other recent outputs, merged (a node keeps its best score). A node no
        continuation of the context reached is the variant's ("pool")."""
        cfg = self.prompt.config
        for n in range(min(cfg.max_ngram, len(tokens)), cfg.min_ngram - 1, -1):
            starts = self.prompt.starts(tokens, n, counts.recent)
            own = continuation_counts(tokens, starts, counts.max_len)
            others = (
                self.pool.outputs.continuations(
                    tokens[-n:], counts.recent_outputs, counts.max_len, skip=self._output_id
                )
                if counts.recent_outputs
                else []
            )
            found = count_paths(others, dict(own))
            node_of: dict[tuple[int, ...], int] = {}
            occurrences = len(starts) + len(others)
            for path, score in path_log_scores(found, occurrences, counts.alpha(n)).items():
                parent = node_of[path[:-1]] if len(path) > 1 else -1
                owner = f"prompt:{n}" if path in own else "pool"
                node_of[path] = trie.add(parent, path[-1], score, owner)

    def _extend(self, chain: list[int], key_len: int) -> list[int]:
        """A pool chain lengthened by looking its own tail up, up to `pool_draft_len` tokens."""
        while len(chain) < self.config.pool_draft_len and len(chain) >= key_len:
            more = self.pool.get(chain[-key_len:], 1)
            if not more:
                break
            chain.extend(more[0])
        return chain[: self.config.pool_draft_len]

    def _add_eagle(self, trie: DraftTrie, tokens: list[int]) -> None:
        ids, parents, scores = self.eagle.candidates(tokens)
        node_of: dict[int, int] = {}
        for i, (token, parent, score) in enumerate(zip(ids, parents, scores)):
            node_of[i] = trie.add(node_of[parent] if parent >= 0 else -1, token, score, "eagle")

    def _calibrated(self, trie: DraftTrie) -> list[float]:
        """Each node's log score after calibration, never above its parent's (so best first
        stays closed under ancestors)."""
        if self.calibration is None:
            return trie.scores
        out: list[float] = []
        for score, parent, owner in zip(trie.scores, trie.parents, trie.owners):
            p = self.calibration.calibrated(owner.split(":")[0], math.exp(score))
            log_p = math.log(max(p, 1e-12))
            out.append(min(log_p, out[parent]) if parent >= 0 else log_p)
        return out

    def _select(self, trie: DraftTrie, aux: int) -> DraftTree:
        scores = self._calibrated(trie)
        order = sorted(range(len(trie.tokens)), key=lambda i: (-scores[i], i))
        probs = [math.exp(scores[i]) for i in order]
        chain_len = chain_prefix(order, trie.parents)
        curve, trees = self.config.relative_cost, self.config.relative_tree_cost
        rate = None  # plain decoding reaches 1: the request's rate is never priced below it
        if self.config.rate_aware and self._cost:
            rate = max(1.0, self._tokens / self._cost)
        k = keep_count(probs, self.config.budget, aux, curve, chain_len, trees, rate)
        self._step_cost = step_cost(k, aux, curve, chain_len, trees) if curve else 1.0
        keep = sorted(order[:k])  # best first is closed under ancestors: scores fall with depth
        new_index = {old: new for new, old in enumerate(keep)}
        paths: dict[int, tuple[int, ...]] = {}
        self._owners, self._predicted = {}, {}
        for i in keep:
            parent = trie.parents[i]
            paths[i] = (paths[parent] if parent >= 0 else ()) + (trie.tokens[i],)
            self._owners[paths[i]] = trie.owners[i].split(":")[0]
            self._predicted[paths[i]] = math.exp(trie.scores[i])
        return DraftTree(
            tuple(trie.tokens[i] for i in keep),
            tuple(new_index[trie.parents[i]] if trie.parents[i] >= 0 else -1 for i in keep),
        )

    def observe(self, draft: Draft, aux_tokens: list[int], tokens: list[int]) -> None:
        committed = tokens[self._proposed_at :]  # accepted draft tokens, then the bonus (if room)
        self._tokens, self._cost = self._tokens + len(committed), self._cost + self._step_cost
        verified = tree_paths(draft.tree)
        ngram_reach = 0
        for source, chain in self._chains:
            depth = 0
            while depth < len(chain) and tuple(chain[: depth + 1]) in verified:
                depth += 1
            matched = common_prefix(chain[:depth], committed)
            self.stats.record(source, depth, matched)
            ngram_reach = max(ngram_reach, matched)
        accepted, from_pool = 0, 0
        for d in range(1, len(committed) + 1):  # the bonus is never a kept node: it stops there
            owner = self._owners.get(tuple(committed[:d]))
            if owner is None:
                break
            self.accepted_by_source[owner] += 1
            accepted, from_pool = d, from_pool + (owner == "pool")
        if self.calibration is not None:
            self._calibrate(tuple(committed[:accepted]))
        if self._drafter_s > 0:
            self.gate.record_tokens(accepted, accepted - min(ngram_reach, accepted))
        if self.eagle is not None:
            self._eagle_rows_share = self._rows_share(draft, "eagle")
        if draft.aux is not None and self.config.relative_cost:
            self._price_window(draft, accepted, from_pool)
        self.lookahead.observe(draft, aux_tokens, tokens)  # no window: feeds the pool only
        self.pool.outputs.extend(self._output_id, tokens[self._indexed :])
        self._indexed = len(tokens)

    def _calibrate(self, accepted: tuple[int, ...]) -> None:
        """Every kept node's outcome: accepted iff its path is a prefix of the accepted tokens."""
        self.calibration.record(
            [
                (self._owners[path], p, path == accepted[: len(path)])
                for path, p in self._predicted.items()
            ]
        )

    def _rows_share(self, draft: Draft, owner: str) -> float:
        """The share of this verify's cost (on the cost curve) that `owner`'s kept nodes added;
        0 without a curve. Example: 8 rows of which 4 EAGLE's, costs {4: 1.0, 8: 1.25} -> 0.2."""
        if not self.config.relative_cost:
            return 0.0
        rows = 1 + len(draft.tree) + (len(draft.aux.tokens) if draft.aux else 0)
        own = sum(1 for o in self._owners.values() if o == owner)
        full = relative_at(self.config.relative_cost, rows)
        return 1 - relative_at(self.config.relative_cost, rows - own) / full

    def _price_window(self, draft: Draft, accepted: int, from_pool: int) -> None:
        """The window's rows priced by the cost curve against the accepted tokens of the pool's
        nodes (which the window feeds) this step."""
        rows = 1 + len(draft.tree)
        without = relative_at(self.config.relative_cost, rows)
        cost = relative_at(self.config.relative_cost, rows + len(draft.aux.tokens)) - without
        self.window_gate.record_tokens(accepted, from_pool)
        self.window_gate.record_cost(cost, without)

    def observe_features(self, features, tokens: list[int]) -> None:
        """Kept until the next step that drafts with EAGLE (one draft-layer pass for them all)."""
        self._features.append(features)


def _build(config: HybridConfig, ctx: ProposerContext) -> HybridProposer:
    return HybridProposer(config, ctx)


def with_drafter_tree(config: HybridConfig | dict | None, tree: dict) -> dict:
    """The EAGLE part expands as the drafter's device-sized tree does (its depth and top-k);
    which nodes are kept is the merged budget's choice."""
    base = HybridConfig.model_validate(config or {})
    eagle = base.eagle.model_copy(update={"depth": tree["depth"], "topk": tree["topk"]})
    return base.model_copy(update={"eagle": eagle}).model_dump()


def limit(config: HybridConfig, k: int) -> HybridConfig:
    """At most k tokens per step. The tree is worth more than the window that feeds the pool:
    the window stays only while it takes at most half of k.

    Example: budget 12 with a 2 x 2 window (4 rows): k = 6 -> budget 6, no window; k = 10 ->
    the window and budget 6.
    """
    window = config.window
    aux = window.window * (window.ngram - 1) if window else 0
    if aux > k // 2:
        window, aux = None, 0
    return config.model_copy(update={"budget": min(config.budget, k - aux), "window": window})


HYBRID = REGISTRY.register(
    Strategy(
        "hybrid",
        HybridConfig,
        _build,
        limit,
        drafter_kind="eagle",
        drafter_optional=True,
        with_drafter_tree=with_drafter_tree,
    )
)
