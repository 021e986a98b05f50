"""Fine-tuning makes a real, valid adapter that changes the model; data shapes and batching."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from specserve.adapters.resident import ResidentAdapters
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec, validate_adapter
from specserve.engine.decode.engine import Engine
from specserve.engine.lora.batch import BASE_ADAPTER
from specserve.engine.sampling import SamplingParams
from specserve.training.finetune import (
    IGNORE,
    Example,
    FinetuneConfig,
    collate,
    finetune,
    load_examples,
    lr_at,
)


class SpaceTokenizer:
    """Whitespace words "w<i>" <-> ids i; no chat template."""

    chat_template = None
    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(w[1:]) for w in text.split()]}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"w{i}" for i in ids)


def test_collate_pads_right_and_masks():
    batch = collate([Example([5, 6], [IGNORE, 6]), Example([7], [7])], pad_id=0, device="cpu")
    assert batch["input_ids"].tolist() == [[5, 6], [7, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1], [1, 0]]
    assert batch["labels"].tolist() == [[IGNORE, 6], [7, IGNORE]]


def test_load_examples_shapes(tmp_path):
    tok = SpaceTokenizer()
    txt = tmp_path / "a.txt"
    txt.write_text(" ".join(f"w{i}" for i in range(1, 21)))
    assert [len(e.ids) for e in load_examples(txt, tok, eos_id=2, block_size=8)] == [8, 8, 4]
    rows = [
        {"text": "w3 w4 w5"},
        {"prompt": "w7 w8", "completion": "w9 w10"},
        {"messages": [{"role": "user", "content": "w11"}, {"role": "assistant", "content": "w12"}]},
    ]
    data = tmp_path / "a.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    text, completion, chat = load_examples(data, tok, eos_id=2)
    assert text.labels == [3, 4, 5]
    assert completion.ids == [7, 8, 9, 10, 2] and completion.labels == [IGNORE, IGNORE, 9, 10, 2]
    assert chat.ids == [11, 12, 2] and chat.labels == [IGNORE, 12, 2]


@pytest.mark.parametrize("row", [{"prompt": "w1"}, {"text": "w1", "extra": 1}, ["w1"]])
def test_load_examples_refuses_unknown_shapes_naming_the_line(tmp_path, row):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"text": "w1"}) + "\n" + json.dumps(row))
    with pytest.raises(ValueError, match=r"line 2: expected .*prompt"):
        load_examples(data, SpaceTokenizer(), eos_id=2)


def test_config_refuses_unknown_names():
    with pytest.raises(ValueError, match="rnak"):
        FinetuneConfig.model_validate({"rnak": 4})


PATTERN = [10, 20, 30, 40, 50, 60] * 6


def _learn_pattern(base, out):
    """Fine-tune `base` on windows of PATTERN (a task the adapter must learn); the run record."""
    examples = [Example(PATTERN[i : i + 24], PATTERN[i : i + 24]) for i in range(6)] * 4
    config = FinetuneConfig(
        rank=4, learning_rate=3e-2, epochs=25, batch_size=4, held_out_fraction=0.25, dropout=0.0
    )
    return finetune(base, SpaceTokenizer(), examples, config, out, "tiny", {"desc": "pattern"})


def test_finetune_writes_a_valid_adapter_that_learns(tiny_llama, tmp_path):
    base = copy.deepcopy(tiny_llama(0, head_scale=40.0))  # room for confident logits after the norm
    spec = BaseModelSpec.of(base, ["tiny"])
    out = tmp_path / "adapters" / "pattern"
    record = _learn_pattern(base, out)
    before, after = record["held_out_loss_before_after"]
    assert after < 0.5 * before
    checked = validate_adapter(out, spec, AdapterLimits(root=out.parent))
    assert checked.rank == 4 and checked.target_modules == ("k_proj", "o_proj", "q_proj", "v_proj")
    assert json.loads((out / "specserve-finetune.json").read_text())["steps"] == record["steps"] > 0
    # served on a fresh copy of the base, the variant continues the pattern; the base does not
    fresh = copy.deepcopy(tiny_llama(0, head_scale=40.0))
    resident = ResidentAdapters(fresh, ["tiny"], AdapterLimits(root=out.parent))
    resident.ensure("pattern@1", out)
    engine = Engine(resident.model, SpaceTokenizer(), frozenset())
    params = SamplingParams(max_new_tokens=12)
    variant = engine.generate(PATTERN[:8], params, "lookahead", adapter="pattern@1").output_ids
    plain = engine.generate(PATTERN[:8], params, "ar", adapter=BASE_ADAPTER).output_ids
    assert variant == (PATTERN * 3)[8:20]
    assert plain != variant


def test_finetune_stops_at_budget(tiny_llama, tmp_path):
    base = copy.deepcopy(tiny_llama(0))
    examples = [Example(list(range(1, 30)), list(range(1, 30)))] * 8
    config = FinetuneConfig(epochs=1000, budget_minutes=0.02, held_out_fraction=0.0)
    record = finetune(base, SpaceTokenizer(), examples, config, tmp_path / "a", "tiny", {})
    assert record["stopped_by"] == "budget" and 0 < record["steps"] < 1000 * 2


def test_lr_schedule_worked_example_and_reference():
    assert [round(lr_at(1e-3, s, 100), 7) for s in (0, 9, 99)] == [1e-4, 9.1e-4, 5e-5]
    for step in range(0, 200, 7):  # slow reference: warm-up ramp times clamped linear decay
        warm = (step + 1) / 10 if step < 10 else 1.0
        decay = 1.0 - step / 150 if step / 150 < 0.95 else 0.05
        assert abs(lr_at(2e-3, step, 150) - 2e-3 * warm * decay) < 1e-12


def test_training_is_reproducible(tiny_llama, tmp_path):
    """Same data, same seed -> the same adapter (the time budget does not leak into the schedule)."""
    examples = [Example([10, 20, 30, 40] * 5, [10, 20, 30, 40] * 5)] * 8
    config = FinetuneConfig(rank=2, learning_rate=1e-2, epochs=3, held_out_fraction=0.25)
    runs = [
        finetune(
            copy.deepcopy(tiny_llama(0)),
            SpaceTokenizer(),
            examples,
            config,
            tmp_path / str(i),
            "t",
            {},
        )
        for i in range(2)
    ]
    assert runs[0]["held_out_loss_before_after"] == runs[1]["held_out_loss_before_after"]
    assert (tmp_path / "0" / "adapter_model.safetensors").read_bytes() == (
        tmp_path / "1" / "adapter_model.safetensors"
    ).read_bytes()


def test_finetune_on_a_bf16_base_learns_with_float32_lora_weights(tiny_llama, tmp_path):
    """The serving dtype may be bf16 (`--dtype auto`): the frozen base computes in bf16, the LoRA
    weights train in float32, and the adapter serves on a float32 base too."""
    base = copy.deepcopy(tiny_llama(0, head_scale=40.0)).to(torch.bfloat16)
    out = tmp_path / "adapters" / "pattern"
    record = _learn_pattern(base, out)
    assert record["dtype"] == "torch.bfloat16" and record["adapter_dtype"] == "torch.float32"
    before, after = record["held_out_loss_before_after"]
    assert after < 0.5 * before
    fresh = copy.deepcopy(tiny_llama(0, head_scale=40.0))
    resident = ResidentAdapters(fresh, ["tiny"], AdapterLimits(root=out.parent))
    resident.ensure("pattern@1", out)
    engine = Engine(resident.model, SpaceTokenizer(), frozenset())
    params = SamplingParams(max_new_tokens=12)
    variant = engine.generate(PATTERN[:8], params, "ar", adapter="pattern@1").output_ids
    assert variant == (PATTERN * 3)[8:20]


@pytest.mark.parametrize(
    ("family", "targets"),
    [("phi3", ("o_proj", "qkv_proj")), ("gpt_neox", ("dense", "query_key_value"))],
)
def test_default_targets_are_the_familys_own_projections(family, targets, tmp_path):
    from conftest import make_tiny_family

    base = copy.deepcopy(make_tiny_family(family))
    examples = [Example(list(range(1, 30)), list(range(1, 30)))] * 4
    config = FinetuneConfig(epochs=1, held_out_fraction=0.0)
    out = tmp_path / "adapters" / family
    finetune(base, SpaceTokenizer(), examples, config, out, family, {})
    spec = BaseModelSpec.of(make_tiny_family(family), [family])
    assert validate_adapter(out, spec, AdapterLimits(root=out.parent)).target_modules == targets
