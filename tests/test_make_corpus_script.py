"""scripts/make_corpus.py --extend: kept answers survive, new prompts are added in order, and the
file round-trips (no model needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_corpus.py"


@pytest.fixture(scope="module")
def make_corpus():
    spec = importlib.util.spec_from_file_location("make_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_keep_old_answers_in_prompt_order(make_corpus):
    rows = make_corpus.corpus_rows(["a", "b", "c"], {"b": "B"}, {"a": "A", "b": "other"})
    assert rows == [{"prompt": "a", "answer": "A"}, {"prompt": "b", "answer": "B"}]


def test_extend_round_trip(make_corpus, tmp_path):
    path = tmp_path / "corpus.jsonl.gz"
    assert make_corpus.existing_answers(path) == {}
    make_corpus.write_rows(path, make_corpus.corpus_rows(["x", "y"], {}, {"x": "X é", "y": ""}))
    known = make_corpus.existing_answers(path)
    assert known == {"x": "X é", "y": ""}
    rows = make_corpus.corpus_rows(["x", "y", "z"], known, {"z": "Z"})
    make_corpus.write_rows(path, rows)
    assert make_corpus.existing_answers(path) == {"x": "X é", "y": "", "z": "Z"}
    assert not path.with_suffix(".part").exists()
