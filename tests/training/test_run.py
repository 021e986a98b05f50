"""train_drafter end to end on a peft-wrapped tiny target: the manifest records the adapter
fingerprint and the drafter loads for that adapter only."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
from conftest import FAMILIES

from specserve.engine.drafters.artifact import DrafterMismatchError, load_drafter
from specserve.training.corpus import CorpusSettings
from specserve.training.run import train_drafter
from specserve.training.settings import DrafterTrainSettings

ADAPTER = "f" * 64


def _variant_data(path: Path) -> Path:
    """24 prompt/completion pairs in the tiny tokenizer's words (w3..w60)."""
    rng = random.Random(0)
    words = lambda n: " ".join(f"w{rng.randint(3, 60)}" for _ in range(n))
    rows = [{"prompt": words(4), "completion": words(12)} for _ in range(24)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _settings(kind: str, tmp_path: Path) -> DrafterTrainSettings:
    """A few seconds of training on 24 sequences: enough to check the pipeline, not to draft well."""
    corpus = CorpusSettings(instruct=False, docs=0, files=[_variant_data(tmp_path / "v.jsonl")])
    return DrafterTrainSettings(
        kind=kind,
        budget_minutes=0.05,
        corpus=corpus,
        heldout=2,
        eval_seconds=0,
        tau_prompts=2,
        tau_tokens=8,
    )


@pytest.fixture(scope="module")
def lora_target(tiny_llama):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        copy.deepcopy(tiny_llama(1, init_range=0.1)), LoraConfig(r=2, target_modules=["q_proj"])
    ).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_train_on_adapter_variant(tmp_path, tiny_llama, lora_target, tiny_hf_tokenizer, kind):
    settings = _settings(kind, tmp_path)
    drafter = train_drafter(
        lora_target,
        tiny_hf_tokenizer,
        "tiny-lora",
        frozenset({2}),
        tmp_path / kind,
        settings,
        adapter_sha256=ADAPTER,
        data_dir=tmp_path / "data",
    )
    m = drafter.manifest
    assert m.kind == kind and m.adapter_sha256 == ADAPTER and m.base_model_id == "tiny-lora"
    assert m.training["examples"] >= 10 and m.heldout_tau >= 1.0
    assert len(m.accept_rates) == (4 if kind == "medusa" else 6)
    assert load_drafter(tmp_path / kind, lora_target, "tiny-lora", ADAPTER).kind == kind
    with pytest.raises(DrafterMismatchError, match="adapter differs"):
        load_drafter(tmp_path / kind, tiny_llama(1, init_range=0.1), "tiny", None)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "llama"])  # llama: above
def test_drafters_train_and_decode_exactly_on_each_family(
    tmp_path, tiny_hf_tokenizer, tokenizer, family, kind
):
    """Medusa heads and the EAGLE layer (the family's own decoder-layer class) train on each
    family, load for it, and decode what greedy `generate()` gives."""
    import torch
    from conftest import make_tiny_family

    from specserve.engine.decode.engine import Engine
    from specserve.engine.sampling import SamplingParams

    model = make_tiny_family(family, seed=1)
    settings = _settings(kind, tmp_path)
    drafter = train_drafter(
        model,
        tiny_hf_tokenizer,
        "tiny",
        frozenset({2}),
        tmp_path / kind,
        settings,
        data_dir=tmp_path / "data",
    )
    assert drafter.manifest.training["examples"] >= 10 and drafter.manifest.heldout_tau >= 1.0
    loaded = load_drafter(tmp_path / kind, model, "tiny", None)
    ids = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]  # longer than the windowed families' window
    want = model.generate(
        torch.tensor([ids]), max_new_tokens=20, min_new_tokens=20, do_sample=False
    )
    engine = Engine(model, tokenizer, frozenset(), drafters={kind: loaded})
    res = engine.generate(ids, SamplingParams(max_new_tokens=20), kind)
    assert res.output_ids == want[0, len(ids) :].tolist()


def test_training_data_prefilled_in_bf16_held_out_data_as_served(
    tmp_path, tiny_llama, tiny_hf_tokenizer
):
    """teacher_autocast bf16 over an fp32 target: the training corpus's teacher data is bf16,
    the held-out set's is the target's own fp32 (held-out acceptance scores the served target);
    the manifest records both resolved precisions."""
    import torch

    settings = _settings("eagle", tmp_path).model_copy(update={"teacher_autocast": "bfloat16"})
    model = tiny_llama(1, init_range=0.1)
    drafter = train_drafter(
        model,
        tiny_hf_tokenizer,
        "tiny",
        frozenset({2}),
        tmp_path / "eagle",
        settings,
        data_dir=tmp_path / "data",
    )
    dtypes = {}
    for part in (tmp_path / "data").glob("teacher-*/part-*.pt"):
        for features, _ in torch.load(part, weights_only=True).values():
            dtypes.setdefault(part.parent.name, set()).add(features.dtype)
    held = settings.heldout
    sizes = {
        name: sum(
            len(torch.load(p, weights_only=True))
            for p in (tmp_path / "data" / name).glob("part-*.pt")
        )
        for name in dtypes
    }
    by_size = {("held" if n == held else "train"): dtypes[name] for name, n in sizes.items()}
    assert by_size == {"held": {torch.float32}, "train": {torch.bfloat16}}
    assert drafter.manifest.training["precision"]["teacher"] == "bfloat16"
    assert drafter.manifest.training["precision"]["trainer"] in ("bfloat16", "off")
