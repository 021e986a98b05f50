"""`specserve tune`: `--compile on` measures and caches, `auto` follows the measurement."""

from __future__ import annotations

import json


def test_compile_on_measures_and_auto_follows_the_measurement(capsys, tmp_path, model_dir, main):
    """`tune --compile on` compiles, measures and caches; `auto` then decides from that record
    (in float32 only a bit-exact compiled forward may serve)."""
    argv = ["tune", "--model", str(model_dir), "--cache-dir", str(tmp_path), "--no-tune"]
    argv += ["--strategies", "ar"]
    assert main(argv + ["--compile", "on"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["compile"]["enabled"] is True
    record = out["compile"]["record"]
    assert record["graphs"] == 2 and record["compiled_ms"]["1"] > 0 and record["start_s"] > 0
    assert len(list((tmp_path / "costs").glob("compile-*.json"))) == 1
    assert main(argv) == 0  # --compile auto
    captured = capsys.readouterr()
    decision = json.loads(captured.out)["compile"]
    exact = record["max_abs_diff"] == 0.0
    gain = record["eager_ms"]["1"] / record["compiled_ms"]["1"]
    assert decision["enabled"] is (exact and gain >= 1.05)
    assert "auto: measured compiled" in decision["reason"]
    assert f"compile {'on' if decision['enabled'] else 'off'} (auto: measured" in captured.err
