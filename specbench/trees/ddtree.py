"""`ddtree`: the top-B prefixes by summed log-probability (DDTree's best-first lazy heap).

A prefix is a path of per-depth token ranks (r_1..r_d); its score is the float32 sum of the depth
log-probs of those tokens. Since a child never outscores its parent and a rank-(r+1) sibling never
outscores the rank-r one, a heap that starts from the best first child and, on every pop, pushes the
popped node's next sibling and first child, pops prefixes in exactly the tie rule's order
(`specbench.trees`): the first B pops are the optimal tree for the factorised surrogate
E[accepted] ~ sum_v exp(s(v)). Only min(B, V) ranks per depth can ever be used (a rank-r node needs
its r better siblings), so the heap runs over a [D, min(B, V)] top-k table.
"""

from __future__ import annotations

import heapq

import torch

from specbench.trees import TREE_POLICIES
from specbench.trees.base import DepthScores, DraftTree, TreeBatch, TreePolicy, check_budget
from specbench.trees.ranking import f32_add, host_table


@TREE_POLICIES.register("ddtree")
class DDTreePolicy(TreePolicy):
    """Optimal top-B tree over per-depth scores: the heap on the host for scores on the CPU; for scores
    on an accelerator the same tree from `ddtree-vec`'s tensor ops (no host read, capturable; the two
    builders return identical trees: tests/trees/test_trees_optimality.py)."""

    name = "ddtree"
    can_grow = False

    def __init__(self) -> None:
        from specbench.trees.ddtree_vec import DDTreeVecPolicy

        self._device_builder = DDTreeVecPolicy()

    def capturable(self, device: torch.device) -> bool:
        return device.type != "cpu"

    def build_batch(self, anchors: torch.Tensor, logp: torch.Tensor, budget: int) -> TreeBatch:
        if logp.device.type != "cpu":
            return self._device_builder.build_batch(anchors, logp, budget)
        return super().build_batch(anchors, logp, budget)

    def build(self, scores: DepthScores, budget: int) -> DraftTree:
        if scores.logp.device.type != "cpu":
            return self._device_builder.build(scores, budget)
        budget = check_budget(budget)
        depth = min(scores.check().depth, budget)
        device = scores.logp.device
        if depth == 0:
            return DraftTree.from_lists([scores.anchor], [-1], [0], [0.0], device)
        tok, lp = host_table(*DepthScores(scores.anchor, scores.logp[:depth]).topk(min(budget, scores.vocab_size)))
        k = len(tok[0])
        tokens, parents, depths, node_scores = [scores.anchor], [-1], [0], [0.0]
        placed = [0] * (depth + 1)  # nodes popped so far at each depth = the next node's place there
        place = [0]
        # entry: (-score, depth, parent's place at its depth, rank, parent node); the first four are
        # the tie rule's key and are unique, so the parent node is never compared.
        heap = [(-lp[0][0], 1, 0, 0, 0)]
        while heap and len(tokens) <= budget:
            neg, d, parent_place, rank, parent = heapq.heappop(heap)
            node = len(tokens)
            tokens.append(tok[d - 1][rank])
            parents.append(parent)
            depths.append(d)
            node_scores.append(-neg)
            place.append(placed[d])
            placed[d] += 1
            if rank + 1 < k:
                sibling = f32_add(node_scores[parent], lp[d - 1][rank + 1])
                heapq.heappush(heap, (-sibling, d, parent_place, rank + 1, parent))
            if d < depth:
                heapq.heappush(heap, (-f32_add(-neg, lp[d][0]), d + 1, place[node], 0, node))
        return DraftTree.from_lists(tokens, parents, depths, node_scores, device)

