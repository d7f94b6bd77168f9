"""`chain`: a single path, the most likely draft token at every depth."""

from __future__ import annotations

import torch

from specbench.trees import TREE_POLICIES
from specbench.trees.base import DepthScores, DraftTree, TreeError, TreePolicy


@TREE_POLICIES.register("chain")
class ChainPolicy(TreePolicy):
    """budget draft tokens in a line (fewer if the drafter proposes fewer depths)."""

    name = "chain"

    def build(self, scores: DepthScores, budget: int) -> DraftTree:
        depth = min(budget, scores.depth)
        top = scores.logp[:depth].max(dim=-1)
        tree = DraftTree.chain(scores.anchor, top.indices, device=scores.logp.device)
        tree.scores = torch.cat([top.values.new_zeros(1), torch.cumsum(top.values, 0)])
        return tree

    def select(self, candidates: DraftTree, budget: int) -> DraftTree:
        """The best-scoring path: from the root, repeatedly the highest-scoring child (ties: lower id)."""
        if candidates.scores is None:
            raise TreeError("chain.select() needs candidates.scores")
        scores = candidates.scores.tolist()
        children = candidates.children
        keep, node = [0], 0
        while children[node] and len(keep) <= budget:
            node = max(children[node], key=lambda c: (scores[c], -c))
            keep.append(node)
        return candidates.subtree(keep)
