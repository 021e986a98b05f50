"""The conformance probe: Granite and Starcoder2 (outside the known-good list) are admitted and
decode exactly through the engine (fp32, alone and batched, every strategy, with a LoRA); a
recurrent model and an encoder-decoder are refused with the failing check; a failing check
names its step and what it expected and got; results are kept on disk and reused; the LoRA
targets are found from the modules.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from schedules import STRATEGIES, alone, requests, run, with_adapters

from specserve.engine import families
from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.decode.engine import Engine
from specserve.engine.drafters.modules import EagleSpec, MedusaSpec
from specserve.engine.probe import checks, lora_targets, probe, store, tiny
from specserve.engine.probe import run as probe_run
from specserve.engine.probe.projections import find_projections
from specserve.engine.sampling import SamplingParams

pytestmark = pytest.mark.timeout(300)
ALL_CHECKS = [name for name, _ in probe_run.CHECKS]


def granite_config():
    """Granite 3's scaling knobs (embedding, residual, attention multipliers, logits scaling)."""
    return tf.GraniteConfig(
        num_key_value_heads=8,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=0.0078125,
        logits_scaling=8.0,
        tie_word_embeddings=True,
    )


def starcoder2_config():
    """Starcoder2's sliding window, biased projections and c_fc / c_proj MLP."""
    return tf.Starcoder2Config(sliding_window=4096, use_bias=True)


CONFIGS = {"granite": granite_config, "starcoder2": starcoder2_config}


@pytest.fixture(autouse=True)
def fresh_memo():
    store.forget()
    yield
    store.forget()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_granite_and_starcoder2_are_admitted_by_the_probe(name, tmp_path):
    result = probe(CONFIGS[name](), tmp_path)
    assert result.admitted, result.reason()
    assert result.passed == ALL_CHECKS
    assert result.reason().startswith("admitted by probe")
    assert result.lora_targets == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert set(result.lora_checked) == set(result.projections) > set(result.lora_targets)
    family = families.family_of(CONFIGS[name](), tmp_path)
    assert family.admitted == families.BY_PROBE and family.reason == result.reason()


def _tiny(name: str, seed: int = 0):
    return tiny.build(tiny.tiny_config(CONFIGS[name]()), seed)


def _engine(model, tokenizer) -> Engine:
    drafters = {
        "medusa": checks.random_drafter(model, MedusaSpec(heads=2, topk=4), 2),
        "eagle": checks.random_drafter(model, EagleSpec(feature_layers=(0, -1)), 3),
    }
    return Engine(model, tokenizer, frozenset(), drafters=drafters)  # admitted by the probe


@pytest.mark.parametrize("name", list(CONFIGS))
def test_admitted_families_decode_exactly_alone_batched_and_with_lora(name, tokenizer):
    """THE GATE's own schedules on the probe-admitted families, independent of the probe's
    checks: every strategy alone equals generate(); random Scheduler batches over three
    adapters (on attention and MLP projections) and the base equal each request alone."""
    model = _tiny(name)
    window = getattr(model.config, "sliding_window", None)
    assert window == (tiny.WINDOW if name == "starcoder2" else None)
    engine = _engine(model, tokenizer)
    for ids in checks.prompts(96):
        want = checks.greedy(model, ids, 20)
        for strategy, config in STRATEGIES.items():
            res = engine.generate(ids, SamplingParams(max_new_tokens=20), strategy, config)
            assert res.output_ids == want, (name, strategy)
    targets = find_projections(model).all
    assert {"q_proj", "v_proj"} <= set(targets) and len(targets) > 4  # the MLP's too
    engine = _engine(with_adapters(_tiny(name, seed=1), ["v1", "v2", "v3"], targets), tokenizer)
    reqs = requests(5, 10, ["v1", "v2", "v3"])
    scheduler = Scheduler(engine, BatchSettings(max_batch=4, prefill_chunk=16))
    seen = run(engine, scheduler, reqs)
    checked = 0
    for i, req in enumerate(reqs):
        want = alone(engine, req)
        if seen[i].get("cancelled"):
            assert want[: len(seen[i]["ids"])] == seen[i]["ids"]
            continue
        assert seen[i]["ids"] == want, (name, i, req["strategy"], req["adapter"])
        checked += 1
    assert checked >= 6 and seen[-1]["max_rows"] >= 3 and len(seen[-1]["adapters"]) >= 2


@pytest.mark.parametrize("config", [tf.MixtralConfig, tf.Qwen3MoeConfig])
def test_moe_families_are_admitted_with_lora_on_attention(config, tmp_path):
    """Their attention passes the MoE block's `output_router_logits` flag (inert for attention);
    peft maps MLP names onto the fused experts, so the probe's LoRA is on attention."""
    result = probe(config(), tmp_path)
    assert result.admitted, result.reason()
    assert result.lora_checked == ["k_proj", "o_proj", "q_proj", "v_proj"]


def test_a_recurrent_model_is_refused_with_the_failing_check(tmp_path, tokenizer):
    config = tf.MambaConfig()
    result = probe(config, tmp_path)
    assert not result.admitted
    assert result.failure.check == "layer kinds"
    assert "linear_attention" in result.failure.detail
    with pytest.raises(families.UnsupportedModel, match="'mamba' .* probe refused it: layer kinds"):
        families.family_of(config, tmp_path)
    with pytest.raises(families.UnsupportedModel, match="layer kinds"):
        Engine(tiny.build(tiny.tiny_config(config)), tokenizer, frozenset())


def test_an_encoder_decoder_is_refused_as_not_decoder_only(tmp_path):
    result = probe(tf.BartConfig(), tmp_path)
    assert not result.admitted and result.failure.check == "decoder-only"
    assert "encoder-decoder" in result.reason()


def test_a_failing_check_names_its_step_and_what_it_expected_and_got(tmp_path, monkeypatch):
    """A reference that differs from the engine at token 3: the probe refuses, naming it."""
    real = checks.greedy

    def off_at_3(model, ids, max_new=checks.MAX_NEW):
        out = real(model, ids, max_new)
        return out[:3] + [(out[3] + 1) % 96] + out[4:]

    monkeypatch.setattr(checks, "greedy", off_at_3)
    result = probe(granite_config(), tmp_path)
    assert not result.admitted and result.passed == ALL_CHECKS[:3]
    failure = result.failure
    assert (failure.check, failure.step) == ("ar = generate()", 3)
    assert failure.expected.startswith("tokens [") and failure.got.startswith("tokens [")
    assert failure.expected != failure.got
    assert result.reason().startswith("refused by probe: ar = generate() at step 3: expected")


def test_the_result_is_kept_on_disk_and_reused(tmp_path, monkeypatch):
    runs = []
    real = probe_run._run
    monkeypatch.setattr(probe_run, "_run", lambda *a: runs.append(1) or real(*a))
    first = probe(starcoder2_config(), tmp_path)
    (kept,) = tmp_path.glob("*.json")
    assert kept.name.startswith("Starcoder2ForCausalLM-") and tf.__version__ in kept.name
    store.forget()  # a new process: only the file is left
    assert probe(starcoder2_config(), tmp_path) == first and len(runs) == 1
    # the same architecture at other sizes shares the result; other features do not
    bigger = tf.Starcoder2Config(sliding_window=1024, use_bias=True, hidden_size=512)
    assert probe(bigger, tmp_path) == first and len(runs) == 1
    assert probe(tf.Starcoder2Config(sliding_window=None, use_bias=True), tmp_path).admitted
    assert len(runs) == 2
    monkeypatch.setattr(store, "PROBE_VERSION", 99)  # a newer probe does not trust older results
    probe(starcoder2_config(), tmp_path)
    assert len(runs) == 3


@pytest.mark.parametrize(
    ("config", "attention", "mlp"),
    [
        (tf.LlamaConfig(), {"q_proj", "k_proj", "v_proj", "o_proj"}, {"gate_proj", "up_proj"}),
        (tf.Phi3Config(), {"qkv_proj", "o_proj"}, {"gate_up_proj", "down_proj"}),
        (tf.GPTNeoXConfig(), {"query_key_value", "dense"}, {"dense_h_to_4h", "dense_4h_to_h"}),
        (tf.FalconConfig(), {"query_key_value", "dense"}, {"dense_h_to_4h", "dense_4h_to_h"}),
    ],
)
def test_lora_targets_are_found_from_the_modules(config, attention, mlp):
    """The default targets are the attention projections, fused ones included; the MLP's
    (which the probe's LoRA also covers) are found too."""
    assert set(lora_targets(config)) == attention
    found = find_projections(tiny.build(tiny.tiny_config(config)))
    assert set(found.attention) == attention and mlp <= set(found.mlp)


def test_the_known_good_list_gets_found_targets_without_probing(monkeypatch):
    monkeypatch.setattr(probe_run, "_run", lambda *a: pytest.fail("probed a known-good family"))
    family = families.family_of(tf.Phi3Config())
    assert family.admitted == families.KNOWN_GOOD and set(family.lora_targets) == {
        "qkv_proj",
        "o_proj",
    }


def test_building_the_tiny_model_leaves_the_global_rng_alone():
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    lora_targets(tf.Qwen2Config())
    tiny.build(tiny.tiny_config(tf.Qwen2Config()))
    assert torch.equal(torch.rand(3), want)
