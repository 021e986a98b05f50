"""THE GATE: every strategy's greedy output equals plain autoregressive decoding, token for token.

Tiny random Llamas in three regimes (init range 0.02 loops quickly; 0.2 wanders), prompts of
lengths 1..200 built from repeated segments so drafts really get accepted, and strategy configs
covering chains, multi-branch trees, lookahead windows 1..5, n-grams 2..5 and guesses 0..5.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch

from specserve.engine import hf_internals
from specserve.engine.decode.engine import Engine
from specserve.engine.decode.state import GenerationResult
from specserve.engine.ngram_pool import NGramPool
from specserve.engine.proposers import REGISTRY
from specserve.engine.sampling import SamplingParams

MODELS = {  # name -> (seed, init_range)
    "loopy": (0, 0.02),
    "mid": (1, 0.1),
    "wander": (2, 0.2),
}
PROMPT_LENS = [1, 2, 7, 50, 200]
MAX_NEW = 40

pytestmark = pytest.mark.timeout(120)

CONFIGS = {
    "pl-default": ("prompt_lookup", {}),
    "pl-chain1": ("prompt_lookup", {"max_ngram": 1, "draft_len": 1, "max_matches": 1}),
    "pl-wide": (
        "prompt_lookup",
        {"max_ngram": 4, "min_ngram": 1, "draft_len": 8, "max_matches": 4},
    ),
    "pl-long-ngram": (
        "prompt_lookup",
        {"max_ngram": 5, "min_ngram": 2, "draft_len": 3, "max_matches": 3},
    ),
    "pl-adaptive": (
        "prompt_lookup",
        {"min_ngram": 2, "draft_len": 2, "max_draft_len": 12, "max_matches": 3},
    ),
    "la-default": ("lookahead", {}),
    "la-w1-n2-g0": ("lookahead", {"window": 1, "ngram": 2, "guesses": 0}),
    "la-w2-n3-g1": ("lookahead", {"window": 2, "ngram": 3, "guesses": 1}),
    "la-w3-n4-g3": ("lookahead", {"window": 3, "ngram": 4, "guesses": 3}),
    "la-w4-n5-g5": ("lookahead", {"window": 4, "ngram": 5, "guesses": 5}),
    "la-w5-n2-g4": ("lookahead", {"window": 5, "ngram": 2, "guesses": 4}),
    "la-w5-n5-g2-k2": ("lookahead", {"window": 5, "ngram": 5, "guesses": 2, "key_len": 2}),
    "la-no-seed": ("lookahead", {"window": 3, "ngram": 3, "guesses": 3, "seed_from_prompt": False}),
    "hy-default": ("hybrid", {}),
    "hy-no-window": ("hybrid", {"window": None, "budget": 6}),
    "hy-one-token": ("hybrid", {"budget": 1, "pool_guesses": 1}),
    "hy-wide": (
        "hybrid",
        {
            "budget": 24,
            "pool_guesses": 8,
            "pool_draft_len": 10,
            "window": {"window": 4, "ngram": 4},
        },
    ),
    "hy-cost-curve": ("hybrid", {"relative_cost": {1: 1.0, 4: 1.2, 8: 1.6, 16: 2.6, 32: 5.0}}),
}


def make_prompt(n: int, seed: int, vocab: int = 96) -> list[int]:
    """Two segments repeated in a random interleaving, cut to n tokens."""
    rng = random.Random(1000 + seed)
    a = [rng.randrange(vocab) for _ in range(7)]
    b = [rng.randrange(vocab) for _ in range(5)]
    seq: list[int] = []
    while len(seq) < n:
        seq += a + (b if rng.random() < 0.5 else [])
    return seq[:n]


class Gate:
    """Engines and generation results, memoized so every test can compare against `ar`."""

    def __init__(self, tiny_llama, tokenizer) -> None:
        self.models = {name: tiny_llama(seed, init_range=ir) for name, (seed, ir) in MODELS.items()}
        self.tokenizer = tokenizer
        self.engine = functools.cache(self._engine)
        self.run = functools.cache(self._run)

    def _engine(self, model_name: str, eos: tuple[int, ...] = ()) -> Engine:
        return Engine(self.models[model_name], self.tokenizer, frozenset(eos))

    def _run(
        self, model_name: str, config: str, n_prompt: int, max_new: int = MAX_NEW, seed: int = 123
    ) -> GenerationResult:
        strategy, cfg = ("ar", None) if config == "ar" else CONFIGS[config]
        prompt = make_prompt(n_prompt, MODELS[model_name][0])
        params = SamplingParams(max_new_tokens=max_new, seed=seed)
        return self.engine(model_name).generate(prompt, params, strategy, cfg)


@pytest.fixture(scope="module")
def gate(tiny_llama, tokenizer) -> Gate:
    return Gate(tiny_llama, tokenizer)


@pytest.mark.parametrize("n_prompt", PROMPT_LENS)
@pytest.mark.parametrize("model_name", list(MODELS))
def test_ar_equals_hf_generate(gate, model_name, n_prompt):
    model = gate.models[model_name]
    prompt = make_prompt(n_prompt, MODELS[model_name][0])
    ours = gate.run(model_name, "ar", n_prompt)
    with torch.inference_mode():
        ref = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, n_prompt, dtype=torch.long),
            do_sample=False,
            max_new_tokens=MAX_NEW,
            min_new_tokens=MAX_NEW,
        )
    assert ours.output_ids == ref[0, n_prompt:].tolist()
    assert ours.prompt_ids == prompt
    assert ours.finish_reason == "length" and len(ours.output_ids) == MAX_NEW
    assert ours.forwards == MAX_NEW and ours.tau == 1.0


@pytest.mark.parametrize("n_prompt", PROMPT_LENS)
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_output_equals_ar(gate, config, model_name, n_prompt):
    ref = gate.run(model_name, "ar", n_prompt)
    got = gate.run(model_name, config, n_prompt)
    assert got.output_ids == ref.output_ids
    assert got.text == ref.text
    assert got.finish_reason == "length"
    assert got.strategy == CONFIGS[config][0]
    assert 1 <= got.forwards <= MAX_NEW
    assert got.tau == pytest.approx(MAX_NEW / got.forwards)


@pytest.mark.parametrize("pad_width", [lambda k: k + 5, lambda k: -(-k // 8) * 8], ids=["+5", "x8"])
@pytest.mark.parametrize("n_prompt", [1, 50])
@pytest.mark.parametrize("config", ["pl-wide", "la-w3-n4-g3", "la-w5-n2-g4"])
def test_padded_verify_width_equals_ar(gate, tokenizer, config, n_prompt, pad_width):
    """Inert padding rows (the device's cheapest width) change nothing but the cost."""
    ref = gate.run("mid", "ar", n_prompt)
    strategy, cfg = CONFIGS[config]
    engine = Engine(gate.models["mid"], tokenizer, frozenset(), pad_width)
    got = engine.generate(
        make_prompt(n_prompt, 1), SamplingParams(max_new_tokens=MAX_NEW), strategy, cfg
    )
    assert got.output_ids == ref.output_ids
    assert got.tau > 1.0


def test_speculation_is_not_vacuous(gate):
    """Drafts were accepted: the equality above is not trivially that of empty drafts."""
    taus = {(m, c, n): gate.run(m, c, n).tau for m in MODELS for c in CONFIGS for n in PROMPT_LENS}
    assert max(taus.values()) > 2.0
    for strategy in ("prompt_lookup", "lookahead", "hybrid"):
        best = max(t for (m, c, n), t in taus.items() if CONFIGS[c][0] == strategy)
        assert best > 1.2, strategy
    # and even the wandering model gets some speed-up on long repetitive prompts
    assert max(taus[("wander", c, 200)] for c in CONFIGS) > 1.2


def test_tree_paths_are_exercised(gate, monkeypatch):
    """Accepted paths include partial ones and non-first branches (gathered cache rows)."""
    seen: list[tuple[int, ...]] = []
    real = hf_internals.keep_rows

    def spy(cache, start, rows):
        seen.append(tuple(rows))
        return real(cache, start, rows)

    monkeypatch.setattr(hf_internals, "keep_rows", spy)
    for model_name in ("mid", "wander"):
        for config in ("pl-wide", "la-w4-n5-g5"):
            for n in (7, 50):
                ref = gate.run(model_name, "ar", n)
                strategy, cfg = CONFIGS[config]
                got = gate.engine(model_name).generate(
                    make_prompt(n, MODELS[model_name][0]),
                    SamplingParams(max_new_tokens=MAX_NEW, seed=5),
                    strategy,
                    cfg,
                )
                assert got.output_ids == ref.output_ids
    gathered = [r for r in seen if r != tuple(range(len(r)))]
    assert len(gathered) >= 3
    assert any(len(r) >= 2 for r in gathered)
    assert any(len(r) == 0 for r in seen) and any(len(r) >= 3 for r in seen)


@pytest.mark.parametrize("model_name", ["mid", "wander"])
@pytest.mark.parametrize("lookahead_seed", [0, 1, 2])
def test_lookahead_output_does_not_depend_on_its_seed(gate, model_name, lookahead_seed):
    ref = gate.run(model_name, "ar", 50)
    got = gate.run(model_name, "la-w3-n4-g3", 50, seed=lookahead_seed)
    assert got.output_ids == ref.output_ids


def test_shared_pool_across_requests_stays_lossless(gate):
    pool = NGramPool()
    # junk entries first: wrong drafts must cost speed, never correctness. (They also keep the
    # pool non-empty: an empty shared pool is falsy and is silently replaced, see
    # test_lookahead.py::test_empty_shared_pool_is_used.)
    for t in range(96):
        pool.add((t,), ((t * 7 + 1) % 96, (t * 5 + 2) % 96, (t * 3 + 3) % 96))
    before = len(pool)
    engine = gate.engine("mid")
    for n in (7, 50, 2, 50):
        ref = gate.run("mid", "ar", n)
        got = engine.generate(
            make_prompt(n, 1),
            SamplingParams(max_new_tokens=MAX_NEW),
            "lookahead",
            {"window": 3, "ngram": 4, "guesses": 4},
            pool=pool,
        )
        assert got.output_ids == ref.output_ids
    assert len(pool) > before  # the requests fed the shared pool


@pytest.mark.parametrize("max_new", [1, 2, 3, 5, 17])
@pytest.mark.parametrize("config", ["ar", "pl-wide", "la-w4-n5-g5", "la-w5-n2-g4"])
def test_max_new_tokens_respected_exactly(gate, config, max_new):
    full = gate.run("loopy", "ar", 50)
    got = gate.run("loopy", config, 50, max_new=max_new)
    assert got.output_ids == full.output_ids[:max_new]
    assert got.finish_reason == "length"
    assert got.text == full.text[:max_new]


# ------------------------------------------------------------------ stop strings and EOS
STOP_CONFIGS = ["ar", "pl-default", "pl-wide", "la-default", "la-w4-n5-g5", "la-w1-n2-g0"]


def _generate(engine, prompt, config, **params):
    strategy, cfg = ("ar", None) if config == "ar" else CONFIGS[config]
    return engine.generate(prompt, SamplingParams(**params), strategy, cfg)


@pytest.mark.parametrize(
    "model_name, n_prompt, at, width",
    [
        ("mid", 50, 9, 3),
        ("wander", 7, 15, 2),
        ("loopy", 200, 4, 4),
        ("wander", 1, 22, 1),
    ],
)
def test_stop_strings(gate, model_name, n_prompt, at, width):
    engine = gate.engine(model_name)
    prompt = make_prompt(n_prompt, MODELS[model_name][0])
    full = gate.run(model_name, "ar", n_prompt).text
    stop = full[at : at + width]  # spans `width` one-letter tokens
    cut = full.find(stop)
    texts = set()
    for config in STOP_CONFIGS:
        state = engine.start(
            prompt,
            SamplingParams(max_new_tokens=MAX_NEW, stop=[stop, "#"]),
            *(("ar", None) if config == "ar" else CONFIGS[config]),
        )
        deltas, ids = [], []
        for step in engine.stream(state):
            deltas.append(step.text)
            ids += step.new_ids
        res = engine.result(state)
        assert res.finish_reason == "stop", config
        assert res.text == full[:cut] == "".join(deltas), config
        assert stop not in res.text
        assert ids == res.output_ids
        assert res.output_ids == gate.run(model_name, "ar", n_prompt).output_ids[: len(ids)]
        assert len(res.output_ids) >= cut + width  # the tokens spelling the stop were generated
        texts.add(res.text)
    assert len(texts) == 1


def test_stop_string_with_word_tokens(gate, word_tokenizer):
    engine = Engine(gate.models["wander"], word_tokenizer, frozenset())
    prompt = make_prompt(7, MODELS["wander"][0])
    ids = gate.run("wander", "ar", 7).output_ids
    full = word_tokenizer.decode(ids)
    stop = f"{ids[6]} t{ids[7]}"  # starts inside token 6, ends inside token 7
    cut = full.find(stop)
    for config in STOP_CONFIGS:
        res = _generate(engine, prompt, config, max_new_tokens=MAX_NEW, stop=[stop])
        assert res.finish_reason == "stop"
        assert res.text == full[:cut]


def test_stop_string_never_matching_finishes_by_length(gate):
    """Held-back text is flushed at the end; streamed deltas add up to the full text."""
    full = gate.run("mid", "ar", 7)
    engine = gate.engine("mid")
    for config in STOP_CONFIGS:
        strategy, cfg = ("ar", None) if config == "ar" else CONFIGS[config]
        state = engine.start(
            make_prompt(7, 1), SamplingParams(max_new_tokens=MAX_NEW, stop=["@@@@"]), strategy, cfg
        )
        deltas = [step.text for step in engine.stream(state)]
        res = engine.result(state)
        assert res.finish_reason == "length" and res.text == full.text == "".join(deltas)
        assert res.output_ids == full.output_ids


@pytest.mark.parametrize(
    "model_name, n_prompt, at",
    [
        ("mid", 50, 12),
        ("wander", 7, 20),
        ("wander", 200, 5),
        ("loopy", 2, 3),
    ],
)
def test_eos_stops_every_strategy_at_the_same_place(gate, model_name, n_prompt, at):
    ar_ids = gate.run(model_name, "ar", n_prompt).output_ids
    eos = ar_ids[at]
    first = ar_ids.index(eos)
    engine = gate.engine(model_name, (eos,))
    prompt = make_prompt(n_prompt, MODELS[model_name][0])
    tok = engine.tokenizer
    for config in ["ar", *CONFIGS]:
        res = _generate(engine, prompt, config, max_new_tokens=MAX_NEW)
        assert res.output_ids == ar_ids[: first + 1], config
        assert res.finish_reason == "stop"
        assert res.text == tok.decode(ar_ids[:first])  # the EOS itself is not text
        ignored = _generate(engine, prompt, config, max_new_tokens=MAX_NEW, ignore_eos=True)
        assert ignored.output_ids == ar_ids and ignored.finish_reason == "length"


def test_eos_inside_an_accepted_draft(gate):
    """EOS committed in the middle of a multi-token step: everything after it is dropped."""
    cases = 0
    for model_name, n_prompt in [("mid", 50), ("wander", 200), ("loopy", 50), ("mid", 200)]:
        ar_ids = gate.run(model_name, "ar", n_prompt).output_ids
        prompt = make_prompt(n_prompt, MODELS[model_name][0])
        for config in ["pl-wide", "la-w4-n5-g5"]:
            engine = gate.engine(model_name)
            strategy, cfg = CONFIGS[config]
            state = engine.start(prompt, SamplingParams(max_new_tokens=MAX_NEW), strategy, cfg)
            mid_step, pos = [], 0
            for step in engine.stream(state):
                mid_step += range(pos + 1, pos + len(step.new_ids))
                pos += len(step.new_ids)
            firsts = [i for i in mid_step if ar_ids.index(ar_ids[i]) == i]
            if not firsts:
                continue
            first = firsts[0]
            eos_engine = gate.engine(model_name, (ar_ids[first],))
            res = _generate(eos_engine, prompt, config, max_new_tokens=MAX_NEW)
            assert res.output_ids == ar_ids[: first + 1], (model_name, n_prompt, config)
            assert res.finish_reason == "stop"
            assert res.text == gate.tokenizer.decode(ar_ids[:first])
            cases += 1
    assert cases >= 3


# ----------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("config", ["ar", "pl-wide", "la-default", "la-w4-n5-g5"])
def test_same_seed_same_sampled_output(gate, config):
    engine = gate.engine("wander")
    prompt = make_prompt(50, 2)
    outs = []
    for seed in (7, 7, 8, 9, 10):
        res = _generate(
            engine, prompt, config, max_new_tokens=24, temperature=1.3, top_p=0.95, seed=seed
        )
        assert len(res.output_ids) == 24
        outs.append(res.output_ids)
    assert outs[0] == outs[1]
    assert len({tuple(o) for o in outs}) >= 3  # other seeds sample something else


def test_sampling_with_top_k_one_is_greedy(gate):
    ref = gate.run("wander", "ar", 50)
    for config in ["ar", "pl-wide", "la-w4-n5-g5"]:
        res = _generate(
            gate.engine("wander"),
            make_prompt(50, 2),
            config,
            max_new_tokens=MAX_NEW,
            temperature=0.7,
            top_k=1,
            seed=3,
        )
        assert res.output_ids == ref.output_ids


def test_unseeded_request_leaves_the_global_rng_alone(gate):
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    gate.engine("mid").start([1, 2, 3], SamplingParams(max_new_tokens=2, temperature=1.0))
    assert torch.equal(torch.rand(3), expected)


def test_unseeded_requests_still_work(gate):
    res = gate.engine("mid").generate(
        [1, 2, 3], SamplingParams(max_new_tokens=5, temperature=1.0), "lookahead"
    )
    assert len(res.output_ids) == 5


# ------------------------------------------------------------------------- bad input


def test_unknown_strategy_lists_valid_names(gate):
    with pytest.raises(ValueError) as info:
        gate.engine("mid").generate([1, 2, 3], SamplingParams(max_new_tokens=2), "hydra")
    msg = str(info.value)
    assert "hydra" in msg
    for name in ("ar", "eagle", "lookahead", "medusa", "prompt_lookup"):
        assert name in msg
    assert REGISTRY.names() == sorted(REGISTRY.names())
    assert {"ar", "lookahead", "prompt_lookup"} <= set(REGISTRY.names())


def test_empty_prompt_names_prompt(gate):
    for strategy in ("ar", "lookahead", "prompt_lookup"):
        with pytest.raises(ValueError, match="prompt"):
            gate.engine("mid").generate([], SamplingParams(max_new_tokens=2), strategy)


def test_prompt_beyond_the_context_is_refused(gate):
    limit = gate.models["mid"].config.max_position_embeddings
    with pytest.raises(ValueError, match="prompt: .* exceed the model's context"):
        gate.engine("mid").start([1] * (limit - 3), SamplingParams(max_new_tokens=4))
    gate.engine("mid").start([1] * (limit - 4), SamplingParams(max_new_tokens=4))  # fits exactly


@pytest.mark.parametrize(
    "strategy, bad",
    [
        ("ar", {"window": 3}),
        ("lookahead", {"windw": 3}),
        ("prompt_lookup", {"max_ngrams": 3}),
    ],
)
def test_unknown_config_field_is_named(gate, strategy, bad):
    with pytest.raises(ValueError) as info:
        gate.engine("mid").generate([1, 2], SamplingParams(max_new_tokens=2), strategy, bad)
    assert next(iter(bad)) in str(info.value)
    assert strategy in str(info.value)


def test_config_object_is_accepted(gate):
    from specserve.engine.proposers.lookahead import LookaheadConfig

    ref = gate.run("mid", "ar", 7)
    got = gate.engine("mid").generate(
        make_prompt(7, 1),
        SamplingParams(max_new_tokens=MAX_NEW),
        "lookahead",
        LookaheadConfig(window=2, ngram=3),
    )
    assert got.output_ids == ref.output_ids


def test_acceptance_counters_add_up(gate):
    ar = gate.run("wander", "ar", 200)
    assert ar.drafted_by_depth == [] and ar.accepted_by_depth == []
    res = gate.run("wander", "la-w3-n4-g3", 200)
    accepted = sum(res.accepted_by_depth)
    assert accepted > 0 and len(res.output_ids) <= accepted + res.forwards
    assert all(a <= d for a, d in zip(res.accepted_by_depth, res.drafted_by_depth, strict=False))
    assert res.drafted_by_depth == sorted(res.drafted_by_depth, reverse=True)
    assert res.drafted_by_depth[0] <= res.forwards - 1  # the prefill forward drafts nothing
