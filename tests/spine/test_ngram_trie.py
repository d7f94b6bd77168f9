"""The n-gram drafter's array-built trie equals the trie `DraftTree.from_paths` builds (node order,
tokens, parents, depths) with each node scored log(fraction of the continuations through it)."""

from __future__ import annotations

import math

import numpy as np

from specbench.drafters.ngram import match_trie
from specbench.trees.base import DraftTree


def _counts(tree: DraftTree, conts: list[np.ndarray]) -> list[int]:
    tokens, parents, _ = tree.host
    child = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens)) if p >= 0}
    counts = [len(conts)] + [0] * (tree.num_nodes - 1)
    for c in conts:
        node = 0
        for tok in c.tolist():
            node = child[(node, tok)]
            counts[node] += 1
    return counts


def test_match_trie_equals_from_paths_with_match_fractions() -> None:
    rng = np.random.default_rng(1)
    for trial in range(200):
        conts = [rng.integers(0, 3, rng.integers(1, 7)) for _ in range(rng.integers(1, 9))]  # many shared prefixes
        got = match_trie(7, conts)
        ref = DraftTree.from_paths(7, [c.tolist() for c in conts])
        assert got.host == ref.host, trial
        want = [math.log(k / len(conts)) for k in _counts(ref, conts)]
        assert np.allclose(got.scores.numpy(), want), trial
        got.validate()
