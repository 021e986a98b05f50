"""scripts/make_corpus.py --extend: kept answers survive, new prompts are added in order, and the
file round-trips (no model needed)."""

from __future__ import annotations

import pytest
from script_module import load_script


@pytest.fixture(scope="module")
def make_corpus():
    return load_script("make_corpus")


def test_rows_keep_old_answers_in_prompt_order(make_corpus):
    rows = make_corpus.corpus_rows(["a", "b", "c"], {"b": "B"}, {"a": "A", "b": "other"})
    assert rows == [{"prompt": "a", "answer": "A"}, {"prompt": "b", "answer": "B"}]


def test_a_kept_prompt_is_never_dropped(make_corpus):
    with pytest.raises(ValueError, match="1 prompts of the corpus file"):
        make_corpus.corpus_rows(["a"], {"a": "A", "b": "B"}, {})


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
