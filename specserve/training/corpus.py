"""The fixed text a drafter is trained on by teacher forcing (no generation at training time).

Sources, never benchmark prompts: the instruction corpus shipped in `corpus/instruct.jsonl.gz`
(synthesized prompts answered once by SmolLM2-135M-Instruct, `scripts/make_corpus.py`), passages of
Python's bundled docs as answers to questions about their topic, and the variant's own data files
(the fine-tune shapes of `finetune.load_examples`). `traffic_corpus`: a variant's served requests
(encoded as the model server encodes them), in the order served, as a corpus of its own.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from specserve.engine.prompts import encode_messages, encode_prompt
from specserve.training.finetune import IGNORE, load_examples
from specserve.training.prompts import doc_passages
from specserve.training.traffic import ServedExample

INSTRUCT = Path(__file__).with_name("corpus") / "instruct.jsonl.gz"


class CorpusSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instruct: bool = Field(True, description="the shipped instruction corpus (corpus/instruct)")
    docs: int = Field(
        200, ge=0, description="Python docs passages, each the answer to a question on its topic"
    )
    files: list[Path] = Field(
        default_factory=list, description="the variant's data: .jsonl / .txt as for finetune"
    )
    max_tokens: int = Field(512, ge=8, description="a sequence is cut to this many tokens")
    seed: int = 0


@dataclass(frozen=True)
class Corpus:
    """Token sequences (prompt + answer) and where each answer starts."""

    sequences: list[list[int]]
    prompt_lens: list[int]
    source: str

    def split(self, heldout: int) -> tuple[Corpus, Corpus]:
        """(training, held-out): the last `heldout` sequences are held out."""
        cut = len(self.sequences) - heldout
        return self._part(0, cut), self._part(cut, len(self.sequences))

    def _part(self, a: int, b: int) -> Corpus:
        return Corpus(self.sequences[a:b], self.prompt_lens[a:b], self.source)


def instruct_rows(path: Path = INSTRUCT) -> list[tuple[str, str]]:
    """(prompt, answer) pairs of a corpus file, one JSON object per line."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [(r["prompt"], r["answer"]) for r in map(json.loads, f) if r["answer"].strip()]


def doc_rows(count: int, chars: int = 600) -> list[tuple[str, str]]:
    """(question on a docs topic, a passage of it), every passage of a topic in turn.

    Example: ("What does Python's documentation say about assert?", "The assert statement ...").
    """
    rows = []
    for name, passage in doc_passages(chars)[:count]:
        topic = name.replace("-", " ")
        rows.append((f"What does Python's documentation say about {topic}?", passage))
    return rows


def build_corpus(tokenizer, eos_id: int, settings: CorpusSettings) -> Corpus:
    """Every source tokenized (prompts through the chat template), shuffled with `seed`."""
    pairs = (instruct_rows() if settings.instruct else []) + doc_rows(settings.docs)
    seqs, plens, sources = [], [], []
    for prompt, answer in pairs:
        p = encode_prompt(tokenizer, prompt)
        a = list(tokenizer(answer, add_special_tokens=False)["input_ids"]) + [eos_id]
        seqs.append((p + a)[: settings.max_tokens])
        plens.append(len(p))
    if settings.instruct:
        sources.append(f"instruct corpus ({INSTRUCT.name})")
    if settings.docs:
        sources.append(f"{settings.docs} Python docs passages")
    for path in settings.files:
        for ex in load_examples(path, tokenizer, eos_id, settings.max_tokens):
            answer_at = next((i for i, y in enumerate(ex.labels) if y != IGNORE), 0)
            seqs.append(ex.ids)
            plens.append(answer_at)
        sources.append(Path(path).name)
    keep = [i for i, s in enumerate(seqs) if len(s) - plens[i] >= 2 and len(s) >= 3]
    random.Random(settings.seed).shuffle(keep)
    if len(keep) < 4:
        raise ValueError(f"train-drafter: the corpus holds {len(keep)} usable examples (need 4)")
    return Corpus([seqs[i] for i in keep], [plens[i] for i in keep], " + ".join(sources))


def traffic_corpus(
    tokenizer, eos_id: int, served: list[ServedExample], max_tokens: int = 512
) -> Corpus:
    """Served requests oldest first (not shuffled: `split` holds out the most recent), each its
    prompt as the model server encoded it and the answer it got (+ EOS when it stopped there).
    Examples too short to train on are left out."""
    seqs, plens = [], []
    for ex in served:
        if ex.messages is not None:
            p = encode_messages(tokenizer, ex.messages)
        else:
            p = encode_prompt(tokenizer, ex.prompt or "", chat=False)
        a = list(tokenizer(ex.output, add_special_tokens=False)["input_ids"])
        a += [eos_id] if ex.finish_reason == "stop" else []
        seq = (p + a)[:max_tokens]
        if len(seq) - len(p) >= 2:
            seqs.append(seq)
            plens.append(len(p))
    return Corpus(seqs, plens, f"{len(seqs)} served requests")
