"""`chain.select` on a padded candidate tree (tensor ops, `best_path`) picks the host walk's path: random
trees with tied scores (ties: the lower node id), padding after the real nodes, budgets below and above
the depth; no host read."""

from __future__ import annotations

import numpy as np
import torch

from specbench.trees import TREE_POLICIES
from specbench.trees.base import DraftTree

from host_reads import no_host_reads


def test_best_path_equals_the_host_walk_with_ties() -> None:
    chain = TREE_POLICIES.build("chain")
    rng = np.random.default_rng(4)
    for trial in range(300):
        n = int(rng.integers(1, 14))
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
        depth = [0] * n
        for i in range(1, n):
            depth[i] = depth[parents[i]] + 1
        scores = [0.0] + [-float(rng.integers(0, 3)) for _ in range(1, n)]  # few values: many ties
        tokens = rng.integers(0, 9, n).tolist()
        host = DraftTree.from_lists(tokens, parents, depth, scores)
        pad = int(rng.integers(0, 4))
        padded = DraftTree(tokens=torch.tensor(tokens + [0] * pad), parents=torch.tensor(parents + [-1] * pad),
                           depth=torch.tensor(depth + [0] * pad),
                           scores=torch.tensor(scores + [-torch.inf] * pad, dtype=torch.float64),
                           depth_bound=max(depth) + int(rng.integers(0, 2)), meta={"padded": True})
        budget = int(rng.integers(0, 8))
        want = chain.select(host, budget)
        with no_host_reads():
            got = chain.select(padded, budget)
        k = want.num_nodes
        size = 1 + min(budget, padded.depth_bound)
        assert got.num_nodes == size, trial
        g_tokens, g_parents, g_depth = got.host
        assert (g_tokens[:k], g_parents[:k], g_depth[:k]) == want.host, trial
        assert g_parents[k:] == [-1] * (size - k) and g_depth[k:] == [0] * (size - k), trial
        assert got.scores[:k].tolist() == want.scores.tolist(), trial
