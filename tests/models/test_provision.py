"""Tests for specserve.models.provision: a finished conversion is reused as-is; a marker that no
longer matches the catalog is not; unknown names fail listing the known ones."""

from __future__ import annotations

import datetime
import time

import pytest
import torch

from specserve.models import provision
from specserve.models.catalog import ModelLoadError, load_catalog
from specserve.models.load import load_model
from specserve.models.provision import MARKER_FILE, Marker, pull_model


def _finished(tmp_path, source: dict) -> tuple:
    d = tmp_path / "models" / "smollm2-135m"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    marker = Marker(
        name="smollm2-135m",
        source=source,
        gguf_file="m.gguf",
        gguf_sha256="0" * 64,
        converted_with={"transformers": "x"},
        created_at=datetime.datetime.now(datetime.UTC),
    )
    (d / MARKER_FILE).write_text(marker.model_dump_json())
    return d, marker


def test_pull_unknown_name_lists_known(tmp_path):
    with pytest.raises(ModelLoadError, match="smollm2-135m") as ei:
        pull_model("no-such-model", tmp_path)
    assert "no-such-model" in str(ei.value)


def test_pull_returns_cached_dir_without_work(tmp_path):
    """A finished conversion (marker matching the catalog source) is returned as-is."""
    entry = load_catalog()["smollm2-135m"]
    d, _ = _finished(tmp_path, entry.source.model_dump(mode="json"))
    msgs: list[str] = []
    assert pull_model("smollm2-135m", tmp_path, progress=msgs.append) == d
    assert msgs == []


def test_a_marker_of_another_source_is_not_a_finished_conversion(tmp_path, monkeypatch):
    """An outdated marker sends the pull to find the GGUF again (stopped here before any work)."""
    entry = load_catalog()["smollm2-135m"]
    old = entry.source.model_dump(mode="json") | {"version": "0.0.1"}
    _finished(tmp_path, old)

    def stop(*args):
        raise RuntimeError("reconverting")

    monkeypatch.setattr(provision, "_find_gguf", stop)
    with pytest.raises(RuntimeError, match="reconverting"):
        pull_model("smollm2-135m", tmp_path, progress=lambda _: None)


def test_marker_round_trips_through_its_file(tmp_path):
    entry = load_catalog()["smollm2-135m"]
    d, marker = _finished(tmp_path, entry.source.model_dump(mode="json"))
    assert provision._read_marker(d) == marker
    (d / MARKER_FILE).write_text('{"format_version": 2}')
    assert provision._read_marker(d) is None


@pytest.mark.slow
def test_pull_and_load_smollm2(tmp_path):
    msgs: list[str] = []
    path = pull_model("smollm2-135m", tmp_path, progress=msgs.append)
    assert (path / MARKER_FILE).is_file()
    assert (path / "model.safetensors").is_file()

    t0 = time.perf_counter()
    again = pull_model("smollm2-135m", tmp_path, progress=msgs.append)
    assert again == path
    assert time.perf_counter() - t0 < 1.0

    lm = load_model("smollm2-135m", device="cpu", cache_dir=tmp_path)
    assert lm.model_id == "smollm2-135m"
    assert lm.dtype == torch.float32
    assert 2 in lm.eos_token_ids
    assert lm.tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
    assert lm.tokenizer.chat_template
    prompt = lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = lm.model.generate(**prompt, max_new_tokens=12, do_sample=False)
    text = lm.tokenizer.decode(out[0, prompt["input_ids"].shape[1] :])
    assert "Paris" in text
