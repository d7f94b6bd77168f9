"""`ddtree-vec`: the `ddtree` top-B tree in a few tensor ops per depth (no Python heap, no host sync).

Depth by depth it keeps a beam: the best P_d prefixes of depth d in the tie rule's order
(`specbench.trees`), P_d = min(B, prefixes there). The best B prefixes of depth d are all children of
the beam of depth d-1 (a parent precedes each of its children), and the child (parent at beam place i,
rank r) is beaten by every (place <= i, rank <= r) pair, (i+1)(r+1) - 1 prefixes: it can be among the
best B only if (i+1)(r+1) <= B. So each depth ranks ~B ln B candidates, not B*min(B, V). Finally the
best B of all beams (ordered by score, then depth, then beam place) form the tree, in the same node
order as the heap builder's pops, so the two builders return identical trees.

All shapes depend only on (B, D, V), never on the data: the builder can be captured in a CUDA graph.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from specbench.trees import TREE_POLICIES
from specbench.trees.base import Anchor, DepthScores, DraftTree, TreeBatch, TreePolicy, anchor_tensor, check_budget
from specbench.trees.ranking import ranked_topk, top_indices


def candidate_pairs(parents: int, width: int, budget: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(parent place [M], rank [M]) of every pair with (place+1)(rank+1) <= budget, place < parents,
    rank < width, in (place, rank) lexicographic order. Built on the device without a host sync."""
    per_parent = np.minimum(width, budget // np.arange(1, parents + 1))
    total = int(per_parent.sum())
    counts = (budget // torch.arange(1, parents + 1, device=device)).clamp_(max=width)  # [P]
    ends = counts.cumsum(0)
    flat = torch.arange(total, device=device)
    place = torch.searchsorted(ends, flat, right=True)
    rank = flat - (ends - counts)[place]
    return place, rank


def build_top_b(anchor: Anchor, tokens: Tensor, logp: Tensor, budget: int) -> DraftTree:
    """The top-`budget` tree over a ranked per-depth table: tokens, logp [D, K] (ranks ascending): a batch
    of one of `build_top_b_batch` (the anchor a fill or the device anchor itself: no host copy)."""
    root = anchor_tensor(anchor, logp.device)
    return build_top_b_batch(root, tokens[None], logp[None], budget).tree(0)


def build_top_b_batch(anchors: Tensor, tokens: Tensor, logp: Tensor, budget: int) -> TreeBatch:
    """The top-`budget` trees of B ranked tables at once: anchors [B], tokens, logp [B, D, K] (ranks
    ascending) -> tree b built from table b alone (per-row float32 additions and stable sorts along the last
    dim, so rows never mix; every shape depends on (D, K, budget) only)."""
    device = logp.device
    b, depth, width = logp.shape
    lp = logp.float().clamp(max=0.0)
    beam_scores = torch.zeros(b, 1, device=device)  # [B, P]: the root
    pairs: dict[int, tuple[Tensor, Tensor]] = {}
    level_scores, level_parent, level_rank = [], [], []
    for d in range(depth):
        beam = beam_scores.shape[1]
        if beam not in pairs:
            pairs[beam] = candidate_pairs(beam, width, budget, device)
        place, rank = pairs[beam]
        cand = beam_scores[:, place] + lp[:, d, rank]  # [B, M] float32
        keep = top_indices(cand, budget)  # [B, P']
        beam_scores = cand.gather(1, keep)
        level_scores.append(beam_scores)
        level_parent.append(place[keep])
        level_rank.append(rank[keep])
    sizes = [s.shape[1] for s in level_scores]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()
    all_scores = torch.cat(level_scores, dim=1)  # [B, T]
    parent_index = torch.cat([level_parent[0].new_full((b, sizes[0]), -1)]
                             + [level_parent[d] + offsets[d - 1] for d in range(1, depth)], dim=1)
    level = torch.cat([torch.full((n,), d + 1, dtype=torch.long, device=device) for d, n in enumerate(sizes)])
    chosen = top_indices(all_scores, budget)  # [B, N-1]
    m = chosen.shape[1]
    node_of = torch.zeros(b, all_scores.shape[1], dtype=torch.long, device=device)
    node_of.scatter_(1, chosen, torch.arange(1, m + 1, device=device).expand(b, m))
    chosen_parent = parent_index.gather(1, chosen)
    parents = torch.where(chosen_parent >= 0, node_of.gather(1, chosen_parent.clamp(min=0)), 0)
    chosen_level = level[chosen]  # [B, N-1]
    flat = (chosen_level - 1) * width + torch.cat(level_rank, dim=1).gather(1, chosen)
    root = anchors.reshape(b, 1).to(device=device, dtype=torch.long)
    return TreeBatch(tokens=torch.cat([root, tokens.reshape(b, -1).gather(1, flat)], dim=1),
                     parents=torch.cat([root.new_full((b, 1), -1), parents], dim=1),
                     depth=torch.cat([root.new_zeros(b, 1), chosen_level], dim=1),
                     scores=torch.cat([all_scores.new_zeros(b, 1), all_scores.gather(1, chosen)], dim=1),
                     depth_bound=depth)


@TREE_POLICIES.register("ddtree-vec")
class DDTreeVecPolicy(TreePolicy):
    """`ddtree`'s exact tree from tensor ops on the scores' device (GPU-friendly, sync-free). On CUDA
    the build is one Triton program (`specbench.kernels.top_b_tree`, tested equal to `build_top_b`)."""

    name = "ddtree-vec"
    can_grow = False

    def __init__(self) -> None:
        self._kernels: dict[tuple[int, int, torch.device], object] = {}  # (budget, width, device) -> TopBTree

    def capturable(self, device: torch.device) -> bool:
        return True

    def build(self, scores: DepthScores, budget: int) -> DraftTree:
        budget = check_budget(budget)
        depth = min(scores.check().depth, budget)
        if depth == 0:
            root = DraftTree.root_only(scores.anchor, scores.logp.device)
            root.scores = torch.zeros(1, device=scores.logp.device)
            return root
        tokens, logp = DepthScores(scores.anchor, scores.logp[:depth]).topk(min(budget, scores.vocab_size))
        if logp.is_cuda:
            return self._kernel_build(scores.anchor, tokens, logp, budget)
        return build_top_b(scores.anchor, tokens, logp, budget)

    def build_batch(self, anchors: Tensor, logp: Tensor, budget: int) -> TreeBatch:
        """`build` of B tables logp [B, D, V] (anchors [B]): one ranked top-k over every row, then
        `build_top_b_batch` (on CUDA one launch of the Triton builder, a program per tree)."""
        budget = check_budget(budget)
        b, depth, vocab = logp.shape
        depth = min(depth, budget)
        if depth == 0:
            return super().build_batch(anchors, logp, budget)
        k = min(budget, vocab)
        values, ids = ranked_topk(logp[:, :depth].reshape(b * depth, vocab), k)  # DepthScores.topk, every row
        tokens, lp = ids.reshape(b, depth, k), values.reshape(b, depth, k)
        if lp.is_cuda:
            tok, par, dep, score = self._kernel(budget, k, lp.device).batch(anchors.reshape(b).long(), tokens, lp)
            return TreeBatch(tokens=tok, parents=par, depth=dep, scores=score, depth_bound=depth)
        return build_top_b_batch(anchors, tokens, lp, budget)

    def _kernel(self, budget: int, width: int, device: torch.device):  # type: ignore[no-untyped-def]
        from specbench.kernels.top_b_tree import TopBTree

        key = (budget, width, device)
        if key not in self._kernels:
            self._kernels[key] = TopBTree(budget, width, device)
        return self._kernels[key]

    def _kernel_build(self, anchor: Anchor, tokens: Tensor, logp: Tensor, budget: int) -> DraftTree:
        kernel = self._kernel(budget, logp.shape[1], logp.device)
        tok, par, dep, score = kernel(anchor_tensor(anchor, logp.device), tokens, logp)
        return DraftTree(tokens=tok, parents=par, depth=dep, scores=score, depth_bound=logp.shape[0])
