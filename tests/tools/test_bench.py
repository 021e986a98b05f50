"""`tools/bench.run_bench` with warm pools: each method keeps one n-gram pool across the prompts
(a served variant's pool outlives its requests), and outputs stay `ar`'s."""

from __future__ import annotations

from specserve.tools.bench import BenchPrompt, build_report, format_table, run_bench, warm_pools


def test_warm_pools_outlive_the_prompts_and_leave_outputs_alone(model, make_engine):
    engine = make_engine(model)
    prompts = [BenchPrompt("t", i, [3 + i, 7, 9, 3 + i, 7, 9, 11]) for i in range(3)]
    methods = {"ar": None, "lookahead": {}, "prompt_lookup": {}}
    pools = warm_pools(methods)
    totals = run_bench(engine, prompts, methods, 10, log=lambda _: None, pools=pools)
    fresh = run_bench(engine, prompts, methods, 10, log=lambda _: None)
    for name in methods:
        assert totals[name].outputs == fresh[name].outputs == totals["ar"].outputs, name
    for prompt in prompts:  # every prompt's n-grams went into the one pool
        assert pools["lookahead"].get(prompt.ids[:1], 8), prompt.question_id
    assert len(pools["prompt_lookup"]) == 0  # prompt lookup drafts from the context alone


def test_report_gives_each_method_its_draft_cost(model, make_engine):
    """`draft_cost` is the decode steps' drafting seconds over their verify seconds."""
    engine = make_engine(model, eos_ids=(0,))  # generate() needs one
    prompts = [BenchPrompt("t", i, [3 + i, 7, 9, 3 + i, 7, 9, 11]) for i in range(2)]
    methods = {"ar": None, "prompt_lookup": {}, "hf_ar": None}
    totals = run_bench(engine, prompts, methods, 10, log=lambda _: None)
    report = build_report("tiny", "cpu", prompts, 10, totals)
    pl = totals["prompt_lookup"]
    assert pl.draft_seconds > 0 and pl.verify_seconds > 0
    got = report["results"]["prompt_lookup"]["draft_cost"]
    assert got == round(pl.draft_seconds / pl.verify_seconds, 4)
    assert "draft_cost" not in report["results"]["hf_ar"]  # generate() is not timed inside
    assert "draft" in format_table(report)
