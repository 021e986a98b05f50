"""Incremental detokenization with stop strings: emits text deltas, never a stop string.

Text that could still grow into a stop string (or an incomplete UTF-8 character) is held back
until it cannot; as in OpenAI's API, the matched stop string is not part of the output.
"""

from __future__ import annotations


class TextStream:
    """Example: stop ["END"], tokens decoding to "abEN" then "D!" emit "ab" then stop with "ab"."""

    def __init__(self, tokenizer, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self._holdback = max((len(s) for s in self.stop), default=1) - 1
        self.token_ids: list[int] = []
        self.text = ""  # everything emitted so far
        self.stopped = False

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the new text that is safe to emit."""
        self.token_ids.extend(token_ids)
        full = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        cut = self._find_stop(full)
        if cut is not None:
            self.stopped = True
            return self._emit(full[:cut])
        safe = full[: max(len(full) - self._holdback, len(self.text))]
        if safe.endswith("\ufffd"):  # an incomplete multi-byte character
            safe = safe.rstrip("\ufffd")
        return self._emit(safe)

    def finish(self) -> str:
        """Flush what was held back (generation ended without a stop string)."""
        if self.stopped:
            return ""
        full = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        return self._emit(full)

    def _find_stop(self, full: str) -> int | None:
        begin = max(len(self.text) - self._holdback, 0)
        hits = [i for s in self.stop if (i := full.find(s, begin)) >= 0]
        return min(hits) if hits else None

    def _emit(self, upto: str) -> str:
        if not upto.startswith(self.text) or len(upto) <= len(self.text):
            return ""
        delta = upto[len(self.text) :]
        self.text = upto
        return delta
