"""A variant's recent outputs, indexed by token, so a request can count what followed a suffix
in the outputs served before it (SuffixDecoding's idea, scored by the hybrid's counts).

Bounded (the oldest output dropped past `max_outputs`, each kept to `max_tokens`: ~0.5 MB at
most) and thread-safe: the requests of one variant share it beside their n-gram pool, and it goes
with the pool. In memory only; a restart starts it empty.
"""

from __future__ import annotations

import itertools
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence


class _Output:
    """Tokens and, per token, where it occurs: compact arrays (~8 bytes a token)."""

    def __init__(self, max_tokens: int) -> None:
        self.tokens = array("i")
        self.positions: dict[int, array] = {}
        self.max_tokens = max_tokens

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens[: self.max_tokens - len(self.tokens)]:
            self.positions.setdefault(token, array("i")).append(len(self.tokens))
            self.tokens.append(token)

    def continuations(self, suffix: array, max_len: int):
        """Newest first: what followed each occurrence of `suffix` that has a continuation."""
        n = len(suffix)
        for end in reversed(self.positions.get(suffix[-1], ())):
            if n - 1 <= end < len(self.tokens) - 1 and self.tokens[end - n + 1 : end + 1] == suffix:
                yield tuple(self.tokens[end + 1 : end + 1 + max_len])


class OutputIndex:
    """Outputs keyed by the request that writes them; each grows as its tokens are committed.

    Example: index.extend(1, [7, 1, 2]); index.extend(2, [7, 1, 3, 7]); then
    continuations((7,), recent=8, max_len=2) -> [(1, 3), (1, 2)] (newest output first; the
    trailing 7 has no continuation yet), and with skip=2 -> [(1, 2)].
    """

    def __init__(self, max_outputs: int = 64, max_tokens: int = 1024) -> None:
        if max_outputs < 1 or max_tokens < 1:
            raise ValueError("max_outputs and max_tokens must be at least 1")
        self.max_outputs = max_outputs
        self.max_tokens = max_tokens  # an output's tokens past this are not kept
        self._outputs: OrderedDict[int, _Output] = OrderedDict()  # oldest first
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._outputs)

    def new_id(self) -> int:
        """An id for a request's output (ids are never reused)."""
        with self._lock:
            return next(self._ids)

    def extend(self, output_id: int, tokens: Sequence[int]) -> None:
        """Append committed tokens to an output (a new output when the id is new)."""
        with self._lock:
            output = self._outputs.get(output_id)
            if output is None:
                output = self._outputs[output_id] = _Output(self.max_tokens)
                while len(self._outputs) > self.max_outputs:
                    self._outputs.popitem(last=False)
            output.extend(tokens)

    def continuations(
        self, suffix: Sequence[int], recent: int, max_len: int, skip: int | None = None
    ) -> list[tuple[int, ...]]:
        """What followed the last `recent` occurrences of `suffix` (newest output first, latest
        position first), up to `max_len` tokens each; output `skip` (the asker's own) left out."""
        if not suffix:
            return []
        key = array("i", suffix)
        found: list[tuple[int, ...]] = []
        with self._lock:
            for output_id in reversed(self._outputs):
                if output_id == skip:
                    continue
                for continuation in self._outputs[output_id].continuations(key, max_len):
                    found.append(continuation)
                    if len(found) == recent:
                        return found
        return found
