"""`chain`: a single path, the most likely draft token at every depth."""

from __future__ import annotations

import torch

from specbench.trees import TREE_POLICIES
from specbench.trees.base import DepthScores, DraftTree, TreeError, TreePolicy, check_budget
from specbench.trees.grow import ExpandFn, beam_grow, ranked_expand


@TREE_POLICIES.register("chain")
class ChainPolicy(TreePolicy):
    """budget draft tokens in a line (fewer if the drafter proposes fewer depths). Ties: lower token id."""

    name = "chain"
    can_grow = True

    def capturable(self, device: torch.device) -> bool:
        """`build` and `grow` are tensor ops; `select` (a best path through a scored candidate tree) reads
        the host."""
        return True

    def build(self, scores: DepthScores, budget: int) -> DraftTree:
        depth = min(check_budget(budget), scores.check().depth)
        top = scores.logp[:depth].float().max(dim=-1)  # torch returns the first maximal index: the lowest id
        tree = DraftTree.chain(scores.anchor, top.indices, device=scores.logp.device)
        tree.scores = torch.cat([top.values.new_zeros(1), torch.cumsum(top.values.clamp(max=0.0), 0)])
        return tree

    def grow(self, anchor: int, expand: ExpandFn, budget: int, max_depth: int,
             device: torch.device | str = "cpu") -> DraftTree:
        """Greedy autoregressive drafting: expand the last node, append its best token, repeat
        (EAGLE-2's rule with one beam and one child)."""
        return beam_grow(anchor, ranked_expand(expand), check_budget(budget), 1, max_depth, device)

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
