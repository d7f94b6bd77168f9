"""`jetspec-tree`: path-conditioned tree drafting with a block-causal head, two head passes per round.

Pass 1 (as jetspec): [anchor, MASK...] block-causal -> per-depth marginals -> the tree policy builds a
candidate tree. Pass 2: every candidate node's own token at position (committed + depth), with a
tree-causal mask (the context, the node's ancestors and itself). The head was trained so that a
concrete input predicts the next token (clean-prefix blocks, `clean_next`), so node u's output is the
draft law of u's child *conditioned on u's path*. Each candidate is rescored by its cumulative
path-conditioned log-prob, every node is offered its best `extend` children not yet in the tree (one
level below the leaves included), and the policy's `select` keeps the best `budget` nodes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.drafters import DRAFTERS
from specbench.drafters.base import DraftState, Phase
from specbench.drafters.heads.backbone import DraftHead
from specbench.drafters.heads.parallel import ParallelHeadDrafter
from specbench.models.target import TargetModel
from specbench.trees.base import DepthScores, DraftTree, TreePolicy
from specbench.trees.ranking import ranked_topk


def rescore_tree(candidates: DraftTree, node_logp: Tensor, extend: int, max_depth: int) -> DraftTree:
    """Candidates rescored by path-conditioned log-probs, plus new children; no host read.

    node_logp [N, V]: log q(next token | path to node i). A node's score is the sum of its path's
    conditional log-probs (root 0, summed in float64). Each node also gets its `extend` most likely
    next tokens that are not already its children, as new leaves appended after the candidates in
    (node, rank) order, so parents still precede children; those of nodes at depth >= max_depth get
    score -inf (kept for static shapes, never chosen before a finite node). Scores never increase
    from parent to child. On CUDA two launches (`specbench.kernels.rescore_tree`), elsewhere tensor ops
    (`rescore_tree_ops`, its reference).
    """
    dev = node_logp.device
    args = (candidates.tokens.to(dev), candidates.parents.to(dev), candidates.depth.to(dev),
            candidates.ancestor_mask.to(dev), node_logp, extend, max_depth)
    rescore = rescore_tree_ops
    if node_logp.is_cuda:
        from specbench.kernels.rescore_tree import rescore_tree as rescore
    tokens, parents, depth, scores, mask = rescore(*args)
    bound = None if candidates.depth_bound is None else candidates.depth_bound + 1
    tree = DraftTree(tokens=tokens, parents=parents, depth=depth, scores=scores, depth_bound=bound)
    tree.__dict__["ancestor_mask"] = mask  # the cached property, known
    return tree


def rescore_tree_ops(tokens: Tensor, parents: Tensor, depth: Tensor, mask: Tensor, node_logp: Tensor, extend: int,
                     max_depth: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """`rescore_tree` in tensor ops over a candidate tree's tokens, parents, depth [N] and ancestor mask [N, N]:
    (tokens, parents, depth [M], scores [M] float64, ancestor mask [M, M]), M = N * (1 + extend)."""
    n = tokens.numel()
    dev = node_logp.device
    ids = torch.arange(n, device=dev)
    picked = node_logp[parents.clamp(min=0), tokens].double()  # [N]: the N entries only, then float64
    contrib = torch.where(parents >= 0, picked, 0.0)  # [N]: log q(token | parent's path)
    scores = mask.double() @ contrib  # [N]: path sums
    if extend == 0:
        return tokens, parents, depth, scores, mask
    # a node's existing children are masked out of its row (-inf), so its `extend` best fresh tokens are a
    # top-`extend` of the row; the root's write goes to a spare last row, keeping every write the same -inf
    spare = torch.cat([node_logp, node_logp[:1]])  # [N + 1, V]
    masked = torch.full((), float("-inf"), dtype=spare.dtype, device=dev)  # a device value: capturable
    spare.index_put_((torch.where(parents >= 0, parents, n), tokens), masked)
    ext_lp, ext_tok = ranked_topk(spare[:n], extend)  # [N, e]
    ext_lp = ext_lp.double()
    ext_scores = torch.where((depth < max_depth)[:, None], scores[:, None] + ext_lp, float("-inf"))
    # the ancestor mask from the candidates' (a new leaf sees its parent's ancestors and itself):
    # three kernels, where rebuilding it from the parents takes a pointer-doubling loop
    grown = torch.eye(n * (1 + extend), dtype=torch.bool, device=dev)
    grown[:n, :n] = mask
    grown[n:, :n].view(n, extend, n).copy_(mask[:, None])
    return (torch.cat([tokens, ext_tok.flatten()]), torch.cat([parents, ids.repeat_interleave(extend)]),
            torch.cat([depth, (depth + 1).repeat_interleave(extend)]), torch.cat([scores, ext_scores.flatten()]), grown)


@DRAFTERS.register("jetspec-tree")
class JetSpecTreeDrafter(ParallelHeadDrafter):
    """drafter_args: candidates (nodes of the pass-1 tree, default = budget), extend (new children
    offered per node in the re-selection, default 4)."""

    name = "jetspec-tree"
    attention = "block-causal"
    needs_clean_next = True

    def __init__(self, target: TargetModel, checkpoint: str | None = None, head: DraftHead | None = None,
                 block_size: int | None = None, candidates: int | None = None, extend: int = 4,
                 random_init: bool = False, seed: int = 0) -> None:
        super().__init__(target, checkpoint=checkpoint, head=head, block_size=block_size, random_init=random_init,
                         seed=seed)
        if candidates is not None and candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {candidates}")
        if extend < 0:
            raise ValueError(f"extend must be >= 0, got {extend}")
        self.candidates, self.extend = candidates, extend

    def phases(self, state: DraftState, policy: TreePolicy, budget: int) -> list[Phase]:
        if state.want_draft_probs:
            return super().phases(state, policy, budget)
        anchor = state.anchor_on(self.target.device)
        return [("draft", lambda _: DepthScores(anchor, self.pass1(state, self.candidates or budget))),  # pass 1: [D, V]
                ("tree", lambda scores: self.candidate_tree(scores, policy, budget)),
                ("draft", lambda cands: (cands, self.path_logp(state, cands))),  # pass 2: [N, V]
                ("tree", lambda pair: self.reselect(pair[0], pair[1], policy, budget))]

    def capturable(self, policy: TreePolicy) -> bool:
        # the re-selection is the policy's `select`: the default (top scores) is tensor ops
        return super().capturable(policy) and type(policy).select is TreePolicy.select

    def candidate_tree(self, scores: DepthScores, policy: TreePolicy, budget: int) -> DraftTree:
        """Pass 1's tree: the policy's tree over the MASK pass's marginals, of `candidates` nodes."""
        return policy.build(scores, self.candidates or budget)

    def reselect(self, candidates: DraftTree, node_logp: Tensor, policy: TreePolicy, budget: int) -> DraftTree:
        """Candidates rescored by pass 2's path-conditioned log-probs, extended, and cut to `budget`."""
        return policy.select(rescore_tree(candidates, node_logp, self.extend, max_depth=self.block_size), budget)
