"""Shared test helper: a tokenizer stand-in whose words 'w<i>' are token ids, with no chat template."""

from __future__ import annotations


class WordTokenizer:
    """'w<i>' words <-> ids. Example: WordTokenizer()("w5 w9")["input_ids"] == [5, 9]."""

    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(w[1:]) for w in text.split()]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"w{i} " for i in ids)
