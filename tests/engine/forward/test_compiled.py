"""The compiled verify forward: routing before and after warm-up, refusal with adapters, and
decoding through it against `generate()` (bit-exact in float32, or measured not to be)."""

from __future__ import annotations

import copy
import random

import peft
import pytest
import torch

from specserve.engine import hf_internals
from specserve.engine.decode.engine import Engine
from specserve.engine.drafters.modules import EagleSpec, MedusaSpec
from specserve.engine.forward import compiled
from specserve.engine.sampling import SamplingParams
from specserve.engine.ties import check_outputs
from specserve.engine.tuning.cost import measure_cost_curve


def test_unattached_model_is_its_own_runner(model):
    assert compiled.runner(model, 1, 10) is model
    assert compiled.forward_key(model) == "torch.float32"


def test_the_invariant_forward_has_its_own_key(tiny_llama):
    """Its cost curve and tuning are its own: the invariant attention prices widths otherwise."""
    model = copy.deepcopy(tiny_llama(3))
    hf_internals.enable_invariant(model)
    assert compiled.forward_key(model) == "torch.float32+invariant"
    hf_internals.disable_invariant(model)
    assert compiled.forward_key(model) == "torch.float32"


def test_runner_is_eager_until_warm_and_for_wide_calls(tiny_llama):
    model = copy.deepcopy(tiny_llama(3))
    target = compiled.attach(model, compiled.CompileSettings(max_width=8))
    assert compiled.runner(model, 1, 10) is model  # not warm yet: eager
    assert compiled.forward_key(model) == "torch.float32"
    target.record = _record()  # as `warm` leaves it
    assert compiled.runner(model, 1, 10) is target
    assert compiled.runner(model, 8, 10) is target
    assert compiled.runner(model, 9, 10) is model  # prefill-sized calls stay eager
    assert compiled.runner(model, 4, 0) is model  # so does a prefill into an empty cache
    assert compiled.forward_key(model) == "torch.float32+compiled"


def _record() -> compiled.CompileRecord:
    return compiled.CompileRecord(
        model_id="tiny",
        device="cpu",
        dtype="torch.float32",
        threads=1,
        torch=torch.__version__,
        eager_ms={1: 2.0},
        compiled_ms={1: 1.0},
        start_s=1.0,
        max_abs_diff=0.0,
    )


def test_a_model_with_lora_adapters_is_refused(tiny_llama):
    config = peft.LoraConfig(r=2, target_modules=["q_proj"])
    wrapped = peft.get_peft_model(copy.deepcopy(tiny_llama(0)), config)
    with pytest.raises(compiled.CompileUnsupported, match="LoRA"):
        compiled.attach(wrapped, compiled.CompileSettings())


def test_settings_reject_unknown_keys_and_modes():
    with pytest.raises(ValueError):
        compiled.CompileSettings(inductor_mode="sometimes")
    with pytest.raises(ValueError):
        compiled.CompileSettings(widths=3)


@pytest.fixture(scope="module")
def warm_model(tiny_llama):
    """A tiny model with its compiled forward warmed, the hidden-feature shapes included."""
    model = copy.deepcopy(tiny_llama(5))
    settings = compiled.CompileSettings(features=True)
    record = compiled.attach(model, settings).warm("tiny")
    torch.compiler.set_stance("fail_on_recompile")  # a step outside the warmed graphs fails
    yield model, record
    torch.compiler.set_stance("default")


def _prompt(n: int, vocab: int) -> list[int]:
    rng = random.Random(n)
    motif = [rng.randrange(vocab) for _ in range(6)]
    return (motif * (n // 6 + 1))[:n]


def test_warm_up_measures_both_forwards(warm_model):
    model, record = warm_model
    assert set(record.eager_ms) == set(record.compiled_ms) == {1, 2, 4, 8}
    assert record.start_s > 0 and record.dtype == "torch.float32"
    # 1 row and k rows without features: 2 whole graphs; with hidden features transformers'
    # output capturing (forward hooks) breaks the graph, leaving partial graphs around eager code
    assert record.graphs >= 4
    assert record.max_abs_diff < 1e-4  # float32: equal, or within float32 reassociation
    assert compiled.forward_key(model) == "torch.float32+compiled"
    assert measure_cost_curve(model, "tiny", sizes=(1, 2), repeats=1).dtype.endswith("+compiled")


@pytest.mark.parametrize("strategy", ["ar", "prompt_lookup", "lookahead", "medusa", "eagle"])
def test_decoding_through_the_compiled_forward_matches_generate(
    warm_model, tokenizer, random_drafter, strategy
):
    """Every decode step runs in the two warmed graphs (no recompile: the stance would raise);
    the output is greedy generate()'s token for token where the compiled forward is bit-exact,
    else it differs only where the measured compiled-vs-eager noise can flip a tie."""
    model, record = warm_model
    specs = {"medusa": MedusaSpec(heads=2, topk=3), "eagle": EagleSpec()}
    drafters = {k: random_drafter(model, spec, seed=1, scale=0.3) for k, spec in specs.items()}
    engine = Engine(model, tokenizer, frozenset(), drafters=drafters)
    for n in (5, 40):
        prompt = _prompt(n, model.config.vocab_size)
        got = engine.generate(prompt, SamplingParams(max_new_tokens=24), strategy)
        with torch.inference_mode():
            ref = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, n, dtype=torch.long),
                do_sample=False,
                max_new_tokens=24,
                min_new_tokens=24,
            )[0, n:].tolist()
        if record.bit_exact:
            assert got.output_ids == ref
        else:  # a difference only where the measured compiled-vs-eager noise can flip a tie
            gap_noise = 2 * record.max_abs_diff
            check = check_outputs(model, {0: prompt}, {0: ref}, {0: got.output_ids}, gap_noise)
            assert check.all_ties, check
