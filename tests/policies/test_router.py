"""The policy's rules, one test per rule, with the reason visible."""

from __future__ import annotations

from pathlib import Path

import pytest

from specserve.policies.router import Decision, DrafterView, VariantView, decide, requestable
from specserve.policies.settings import PolicySettings

NOW = 1_000_000.0
HOUR = 3600.0
S = PolicySettings()


def view(times, drafters=(), measured=None, forced=None, name="support", speed=None):
    return VariantView(
        name=name,
        version=len(times),
        version_times=list(times),
        drafters=list(drafters),
        measured_tau=measured or {},
        measured_speed=speed or {},
        forced_strategy=forced,
    )


def drafter(kind, state, tau=None):
    return DrafterView(kind=kind, state=state, tau=tau)


STABLE = [NOW - 30 * HOUR, NOW - 5 * HOUR]


def test_three_versions_inside_window_is_lookahead():
    d = decide(
        view([NOW - 50, NOW - 30, NOW - 10], [drafter("eagle", "succeeded", 4.0)]), 0, S, NOW
    )
    assert d.strategy == "lookahead" and "3 versions" in d.reason


def test_young_single_version_is_changing():
    d = decide(view([NOW - 60]), 0, S, NOW)
    assert d.strategy == "lookahead" and "60 s old" in d.reason and d.train_kind is None


def test_stable_with_better_drafter_is_that_drafter():
    d = decide(
        view(
            STABLE,
            [drafter("medusa", "succeeded", 2.0), drafter("eagle", "succeeded", 3.1)],
        ),
        0,
        S,
        NOW,
    )
    assert d == Decision(
        "eagle", "stable; eagle tau 3.10 beats lookahead 1.50 (speeds not measured yet)"
    )


def test_measured_speed_decides_over_acceptance():
    """EAGLE accepts more per forward but its wide trees and draft levels cost more: lookahead
    wins on speed, and the reason names the figures that decided."""
    tau = {"lookahead": (1.7, 10_000), "eagle": (2.4, 10_000)}
    speed = {"lookahead": (1.5, 10_000), "eagle": (1.3, 10_000)}
    d = decide(view(STABLE, [drafter("eagle", "succeeded", 2.5)], tau, speed=speed), 0, S, NOW)
    assert d == Decision(
        "lookahead",
        "stable; eagle measured 1.30x ar (tau 2.40) does not beat lookahead 1.50x (tau 1.70)",
    )
    faster = {"lookahead": (1.5, 10_000), "eagle": (1.9, 10_000)}
    d = decide(view(STABLE, [drafter("eagle", "succeeded", 2.5)], tau, speed=faster), 0, S, NOW)
    assert d.strategy == "eagle" and "eagle measured 1.90x ar" in d.reason


def test_speed_needs_both_figures_and_enough_tokens():
    tau = {"lookahead": (1.7, 10_000), "eagle": (2.4, 10_000)}
    few = {"lookahead": (1.5, 10), "eagle": (1.3, 10_000)}  # lookahead's speed: too few tokens
    d = decide(view(STABLE, [drafter("eagle", "succeeded", 2.5)], tau, speed=few), 0, S, NOW)
    assert d.strategy == "eagle" and "speeds not measured yet" in d.reason


def test_live_figures_override_held_out_and_prior():
    measured = {"lookahead": (2.5, 10_000), "eagle": (2.4, 10_000)}
    d = decide(view(STABLE, [drafter("eagle", "succeeded", 3.5)], measured), 0, S, NOW)
    assert d.strategy == "lookahead" and "does not beat lookahead 2.50" in d.reason


def test_too_few_live_tokens_do_not_count():
    measured = {"lookahead": (9.0, 10)}
    assert (
        decide(view(STABLE, [drafter("eagle", "succeeded", 3.0)], measured), 0, S, NOW).strategy
        == "eagle"
    )


def test_stable_without_drafter_queues_training_unless_off():
    d = decide(view(STABLE), 0, S, NOW)
    assert (d.strategy, d.train_kind) == ("lookahead", "eagle") and "queueing eagle" in d.reason
    off = S.model_copy(update={"auto_train": False})
    assert decide(view(STABLE), 0, off, NOW).train_kind is None
    running = decide(view(STABLE, [drafter("eagle", "running")]), 0, S, NOW)
    assert running.train_kind is None and "in progress" in running.reason


def test_failed_drafter_does_not_serve():
    d = decide(view(STABLE, [drafter("eagle", "failed", 5.0)]), 0, S, NOW)
    assert d.strategy == "lookahead"


def test_a_request_may_ask_for_a_drafter_strategy_only_with_a_usable_drafter():
    names = ["ar", "eagle", "lookahead", "medusa", "prompt_lookup"]
    assert requestable(view(STABLE), names) == ["ar", "lookahead", "prompt_lookup"]
    stored = DrafterView(kind="eagle", state="succeeded", artifact_dir="/d/eagle")
    unstored = drafter("medusa", "succeeded", 3.0)  # no artifact: nothing to load
    training = DrafterView(kind="medusa", state="running", artifact_dir="/d/medusa")
    drafters = [stored, unstored, training]
    assert requestable(view(STABLE, drafters), names) == [
        "ar",
        "eagle",
        "lookahead",
        "prompt_lookup",
    ]


def test_forced_strategy_wins_even_under_load():
    d = decide(view(STABLE, forced="prompt_lookup"), 100, S, NOW)
    assert d == Decision("prompt_lookup", "forced by admin to prompt_lookup")


def test_busy_shortens_drafts_and_saturated_stops_speculation():
    busy = decide(view(STABLE, [drafter("eagle", "succeeded", 3.0)]), S.busy_ongoing, S, NOW)
    assert (
        busy.strategy == "eagle"
        and busy.max_draft_tokens == S.busy_max_draft_tokens
        and "busy" in busy.reason
    )
    full = decide(view(STABLE, [drafter("eagle", "succeeded", 3.0)]), S.saturated_ongoing, S, NOW)
    assert full.strategy == "ar" and "saturated" in full.reason


def test_base_model_never_queues_training():
    assert decide(view([], name=None), 0, S, NOW).train_kind is None


def test_settings_validate_and_load_the_shipped_file():
    shipped = PolicySettings.from_yaml(
        Path(__file__).parents[2] / "specserve" / "configs" / "policy.yaml"
    )
    assert shipped == PolicySettings()
    with pytest.raises(ValueError, match="stabilty"):
        PolicySettings.model_validate({"stabilty_window_s": 5})
    with pytest.raises(ValueError, match="saturated_ongoing"):
        PolicySettings(busy_ongoing=8, saturated_ongoing=8)


HYBRID = PolicySettings(hybrid=True)


def test_hybrid_merges_instead_of_choosing():
    usable = DrafterView(kind="eagle", state="succeeded", tau=1.2, artifact_dir="/d/eagle")
    d = decide(view(STABLE, [usable]), 0, HYBRID, NOW)
    assert d == Decision("hybrid", "stable; hybrid of n-grams and its eagle drafter")
    # a drafter that is not stored yet does not count: n-grams alone, and no second training
    d = decide(view(STABLE, [drafter("eagle", "running")]), 0, HYBRID, NOW)
    assert d.strategy == "hybrid" and "n-grams alone" in d.reason and d.train_kind is None


def test_hybrid_while_changing_and_untrained():
    d = decide(view([NOW - 50, NOW - 30, NOW - 10]), 0, HYBRID, NOW)
    assert d.strategy == "hybrid" and "changing" in d.reason and "n-grams alone" in d.reason
    d = decide(view(STABLE), 0, HYBRID, NOW)
    assert d.strategy == "hybrid" and d.train_kind == "eagle" and "queueing" in d.reason
    assert decide(view(STABLE), HYBRID.saturated_ongoing, HYBRID, NOW).strategy == "ar"


def test_a_drafter_whose_measured_tau_dropped_asks_for_a_retrain_from_traffic():
    held_out = [drafter("eagle", "succeeded", 3.0)]
    fine = decide(view(STABLE, held_out, {"eagle": (2.8, 1000)}), 0, S, NOW)
    assert fine.strategy == "eagle" and fine.retrain_kind is None
    dropped = decide(view(STABLE, held_out, {"eagle": (2.0, 1000)}), 0, S, NOW)
    assert dropped.strategy == "eagle" and dropped.retrain_kind == "eagle"
    assert "eagle measured tau 2.00 < 0.80 x held-out 3.00" in dropped.reason
    below = decide(view(STABLE, held_out, {"eagle": (1.2, 1000)}), 0, S, NOW)
    assert below.strategy == "lookahead" and below.retrain_kind == "eagle"
    few = decide(view(STABLE, held_out, {"eagle": (1.2, 10)}), 0, S, NOW)  # too few tokens
    assert few.retrain_kind is None
    off = PolicySettings(retrain_on_drop=False)
    assert decide(view(STABLE, held_out, {"eagle": (1.2, 1000)}), 0, off, NOW).retrain_kind is None
    busy = decide(view(STABLE, held_out, {"eagle": (2.0, 1000)}), S.busy_ongoing, S, NOW)
    assert busy.retrain_kind == "eagle" and busy.max_draft_tokens == S.busy_max_draft_tokens
