"""`specserve models show`: a probe-admitted architecture says so (as the load's log line does);
a refused one exits 1 with the probe's failing check."""

from __future__ import annotations

import logging

import transformers as tf

from specserve.engine.probe import store, tiny


def _save(config, path):
    tiny.build(tiny.tiny_config(config)).save_pretrained(path)
    return path


def test_show_and_load_say_admitted_by_probe(
    main, tmp_path, capsys, caplog, monkeypatch, tiny_hf_tokenizer
):
    from specserve.models.load import load_model

    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path / "cache"))
    store.forget()
    model_dir = _save(tf.GraniteConfig(), tmp_path / "granite")
    tiny_hf_tokenizer.save_pretrained(model_dir)
    assert main(["models", "show", str(model_dir)]) == 0
    out = capsys.readouterr().out
    assert "granite (GraniteForCausalLM)" in out and "served: admitted by probe" in out
    assert "default LoRA targets: q_proj, k_proj, v_proj, o_proj" in out
    assert list((tmp_path / "cache" / "probe").glob("GraniteForCausalLM-*.json"))
    with caplog.at_level(logging.INFO, logger="specserve.models.load"):
        store.forget()  # from the file this time
        loaded = load_model(str(model_dir), device="cpu", dtype="float32")
    assert type(loaded.model).__name__ == "GraniteForCausalLM"
    assert any("admitted by probe" in r.getMessage() for r in caplog.records)


def test_show_refuses_a_recurrent_model_with_its_check(main, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path / "cache"))
    model_dir = _save(tf.MambaConfig(), tmp_path / "mamba")
    assert main(["models", "show", str(model_dir)]) == 1
    out = capsys.readouterr().out
    assert "refused" in out and "conformance probe refused it: layer kinds" in out
