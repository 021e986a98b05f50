"""The hybrid's merged trie: its worked example and the paths of a draft tree."""

from __future__ import annotations

import pytest

from specserve.engine.proposers.draft_trie import DraftTrie, tree_paths
from specserve.engine.tree import DraftTree


def test_worked_example():
    trie = DraftTrie()
    trie.add_chain([5, 6], [-0.1, -0.2], "prompt")
    trie.add(-1, 5, -0.05, "eagle")
    assert len(trie) == 2 and trie.tokens == [5, 6] and trie.parents == [-1, 0]
    assert trie.scores == pytest.approx([-0.05, -0.3])
    assert trie.owners == ["eagle", "prompt"]
    trie.add(-1, 5, -0.5, "pool")  # a worse score keeps the node's best
    assert trie.owners[0] == "eagle" and trie.scores[0] == pytest.approx(-0.05)


def test_paths_example():
    assert tree_paths(DraftTree((5, 6, 8), (-1, 0, -1))) == {(5,), (5, 6), (8,)}
