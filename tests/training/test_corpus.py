"""The drafter corpus: the shipped instruction corpus loads and holds no benchmark prompt; the
variant's files join it; prompt boundaries are where the chat template ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specserve.training.corpus import CorpusSettings, build_corpus, doc_rows, instruct_rows
from specserve.training.prompts import training_prompts


def test_the_shipped_corpus_loads_and_comes_from_the_training_prompts():
    rows = instruct_rows()
    assert len(rows) >= 500 and all(p and a for p, a in rows)
    assert [p for p, _ in rows] == training_prompts(len(rows), seed=1)  # in order, none left out


def test_no_corpus_prompt_is_a_benchmark_prompt():
    bench = Path(__file__).resolve().parents[3] / "shared" / "bench" / "specbench_dev.jsonl"
    if not bench.exists():  # the checkout's sibling on dev machines
        pytest.skip(f"no benchmark file at {bench}")
    text = bench.read_text()
    assert not any(p in text for p, _ in instruct_rows())


def test_doc_rows_example():
    q, passage = doc_rows(1)[0]
    assert q.startswith("What does Python's documentation say about ") and len(passage) > 50


def test_build_corpus_with_a_variant_file(tmp_path, tiny_hf_tokenizer):
    data = tmp_path / "variant.jsonl"
    rows = [
        {"prompt": f"w{i} w{i + 1}", "completion": f"w{i + 2} w{i + 3} w{i + 4}"} for i in range(8)
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    settings = CorpusSettings(instruct=False, docs=0, files=[data])
    corpus = build_corpus(tiny_hf_tokenizer, 2, settings)
    assert len(corpus.sequences) == 8 and corpus.source == "variant.jsonl"
    for seq, p in zip(corpus.sequences, corpus.prompt_lens):
        assert seq[-1] == 2 and len(seq) - p == 4  # three answer words and EOS
    assert build_corpus(tiny_hf_tokenizer, 2, settings) == corpus
    train, held = corpus.split(2)
    assert len(train.sequences) == 6 and held.sequences == corpus.sequences[6:]
