"""`chain`: a single path, the most likely draft token at every depth."""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.trees import TREE_POLICIES
from specbench.trees.base import DepthScores, DraftTree, TreeBatch, TreeError, TreePolicy, check_budget
from specbench.trees.grow import ExpandFn, beam_grow, ranked_expand


@TREE_POLICIES.register("chain")
class ChainPolicy(TreePolicy):
    """budget draft tokens in a line (fewer if the drafter proposes fewer depths). Ties: lower token id."""

    name = "chain"
    can_grow = True

    def capturable(self, device: torch.device) -> bool:
        """`build` and `grow` are tensor ops, and so is `select` on a padded candidate tree (`best_path`);
        on any other candidate tree `select` reads the host."""
        return True

    def build(self, scores: DepthScores, budget: int) -> DraftTree:
        depth = min(check_budget(budget), scores.check().depth)
        top = scores.logp[:depth].float().max(dim=-1)  # torch returns the first maximal index: the lowest id
        tree = DraftTree.chain(scores.anchor, top.indices, device=scores.logp.device)
        tree.scores = torch.cat([top.values.new_zeros(1), torch.cumsum(top.values.clamp(max=0.0), 0)])
        return tree

    def build_batch(self, anchors: Tensor, logp: Tensor, budget: int) -> TreeBatch:
        """`build` of B score tables logp [B, D, V] (anchors [B]) in one pass: the same ops over a batch dim."""
        b = logp.shape[0]
        n = min(check_budget(budget), logp.shape[1]) + 1
        top = logp[:, : n - 1].float().max(dim=-1)  # [B, n-1]; first maximal index, as build
        dev = logp.device
        ids = torch.arange(n, dtype=torch.long, device=dev)
        return TreeBatch(tokens=torch.cat([anchors.reshape(b, 1).long(), top.indices], dim=1),
                         parents=(ids - 1).expand(b, n), depth=ids.expand(b, n),
                         scores=torch.cat([top.values.new_zeros(b, 1), torch.cumsum(top.values.clamp(max=0.0), 1)], 1),
                         depth_bound=n - 1,
                         ancestor_mask=torch.ones(n, n, dtype=torch.bool, device=dev).tril_().expand(b, n, n))

    def grow(self, anchor: int, expand: ExpandFn, budget: int, max_depth: int,
             device: torch.device | str = "cpu") -> DraftTree:
        """Greedy autoregressive drafting: expand the last node, append its best token, repeat
        (EAGLE-2's rule with one beam and one child)."""
        return beam_grow(anchor, ranked_expand(expand), check_budget(budget), 1, max_depth, device)

    def select(self, candidates: DraftTree, budget: int) -> DraftTree:
        """The best-scoring path: from the root, repeatedly the highest-scoring child (ties: lower id). A
        padded candidate tree (meta["padded"]: static shape, parentless non-root nodes are padding) gets
        the same path from tensor ops, padded to a static size (`best_path`)."""
        if candidates.scores is None:
            raise TreeError("chain.select() needs candidates.scores")
        if candidates.meta.get("padded"):
            return best_path(candidates, check_budget(budget))
        scores = candidates.scores.tolist()
        children = candidates.children
        keep, node = [0], 0
        while children[node] and len(keep) <= budget:
            node = max(children[node], key=lambda c: (scores[c], -c))
            keep.append(node)
        return candidates.subtree(keep)


def best_path(candidates: DraftTree, budget: int) -> DraftTree:
    """`ChainPolicy.select` on a padded candidate tree in tensor ops (no host read): 1 + min(budget, depth
    bound) nodes, the best path from the root and then padding (parentless, depth 0, score -inf). Each
    node's best child comes from two scatter reductions (highest score, then lowest id); the path follows
    those links by pointer doubling."""
    assert candidates.scores is not None
    n, device = candidates.num_nodes, candidates.device
    steps = min(budget, candidates.depth_bound if candidates.depth_bound is not None else n - 1)
    ids = torch.arange(n, device=device)
    is_child = candidates.parents >= 0  # the root and padding have no parent
    parent = torch.where(is_child, candidates.parents, n)  # [N]: n = a sink slot
    score = torch.where(is_child, candidates.scores.double(), -torch.inf)
    best = score.new_full((n + 1,), -torch.inf).scatter_reduce(0, parent, score, "amax")
    is_best = is_child & (score == best[parent])
    jump = ids.new_full((n + 1,), n).scatter_reduce(0, parent, torch.where(is_best, ids, n), "amin")
    jump = torch.cat([jump[:n], jump.new_full((1,), n)])  # [N + 1]: a node's best child; n = none (the sink's too)
    rank = torch.arange(steps + 1, device=device)
    node = torch.zeros(steps + 1, dtype=torch.long, device=device)  # node k = jump applied k times to the root
    for bit in range(max(steps, 1).bit_length()):
        node = torch.where((rank >> bit) & 1 == 1, jump[node], node)
        jump = jump[jump]
    real = node < n
    at = node.clamp(max=n - 1)
    return DraftTree(tokens=torch.where(real, candidates.tokens[at], 0),
                     parents=torch.where(real, rank - 1, -1), depth=torch.where(real, rank, 0),
                     scores=torch.where(real, candidates.scores[at], -torch.inf),
                     meta=dict(candidates.meta), depth_bound=steps)
