"""How well a trained drafter drafts on prompts it was not trained on: its held-out τ
(`heldout_tau`, recorded in its manifest) and drafters compared on a variant's most recent served
prompts (`compare_on_traffic`, the retrain's replace-or-keep decision)."""

from __future__ import annotations

from specserve.engine.decode.engine import Engine
from specserve.engine.drafters.artifact import Drafter
from specserve.engine.lora.batch import lora_rows
from specserve.engine.sampling import SamplingParams
from specserve.training.corpus import Corpus
from specserve.training.kinds import TRAINERS
from specserve.training.settings import DrafterTrainSettings
from specserve.training.traffic import HeldoutFigures


def compare_on_traffic(
    model,
    tokenizer,
    eos_ids,
    drafters: dict,
    recent: Corpus,
    settings: DrafterTrainSettings,
    adapter: str | None = None,
) -> dict[str, HeldoutFigures]:
    """name -> held-out figures of each drafter decoding the same recent served prompts (with
    `adapter` applied, as it serves)."""
    prompts = [t[:p] for t, p in zip(recent.sequences, recent.prompt_lens)]
    prompts = prompts[-settings.traffic_eval_prompts :]
    with lora_rows(model, [adapter]):
        return {
            name: heldout_figures(model, tokenizer, eos_ids, d, prompts, settings.tau_tokens)
            for name, d in drafters.items()
        }


def heldout_tau(
    model, tokenizer, eos_ids, drafter: Drafter, prompts, settings
) -> tuple[float | None, dict]:
    """Mean τ of greedy decoding of held-out prompts with the drafter (a mid-size tree)."""
    config = TRAINERS.get(drafter.kind).heldout_config
    if not settings.tau_prompts:
        return None, config
    figures = heldout_figures(
        model, tokenizer, eos_ids, drafter, prompts[: settings.tau_prompts], settings.tau_tokens
    )
    return round(figures.tau, 3), config


def heldout_figures(
    model, tokenizer, eos_ids, drafter: Drafter, prompts: list[list[int]], tokens: int
) -> HeldoutFigures:
    """`drafter` decoding each prompt greedily for up to `tokens` tokens with its kind's held-out
    tree: tokens per target forward and drafted / accepted counts, summed over the prompts."""
    config = TRAINERS.get(drafter.kind).heldout_config
    engine = Engine(model, tokenizer, eos_ids, drafters={drafter.kind: drafter})
    params = SamplingParams(max_new_tokens=tokens)
    sums = {"tokens": 0, "forwards": 0, "drafted": 0, "accepted": 0}
    for ids in prompts:
        res = engine.generate(ids, params, drafter.kind, config)
        sums["tokens"] += len(res.output_ids)
        sums["forwards"] += res.forwards
        sums["drafted"] += sum(res.drafted_by_depth)
        sums["accepted"] += sum(res.accepted_by_depth)
    return HeldoutFigures(prompts=len(prompts), **sums)
