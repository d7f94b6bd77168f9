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

from typing import Callable

import torch
from torch import Tensor

from specbench.drafters import DRAFTERS
from specbench.drafters.heads.backbone import DraftHead
from specbench.drafters.heads.parallel import ParallelHeadDrafter
from specbench.models.target import TargetModel
from specbench.trees.base import DepthScores, DraftTree, TreePolicy


def rescore_tree(candidates: DraftTree, node_logp: Tensor, extend: int, max_depth: int) -> DraftTree:
    """Candidates rescored by path-conditioned log-probs, plus new children.

    node_logp [N, V]: log q(next token | path to node i). A node's score is the sum of its path's
    conditional log-probs (root 0). Each node of depth < max_depth also gets its `extend` most likely
    next tokens that are not already its children, as new leaves (appended after the candidates, so
    parents still precede children). Scores never increase from parent to child.
    """
    tokens, parents, depth = candidates.host
    n = len(tokens)
    node_logp = node_logp.float()
    parent_idx = torch.tensor(parents[1:], dtype=torch.long, device=node_logp.device)
    token_idx = candidates.tokens[1:].to(node_logp.device)
    contrib = node_logp[parent_idx, token_idx].tolist() if n > 1 else []
    scores = [0.0] * n
    for v in range(1, n):
        scores[v] = scores[parents[v]] + contrib[v - 1]
    new_tokens, new_parents, new_depth, new_scores = list(tokens), list(parents), list(depth), list(scores)
    if extend > 0:
        children_tokens: list[set[int]] = [set() for _ in range(n)]
        for v in range(1, n):
            children_tokens[parents[v]].add(tokens[v])
        widest = extend + max(len(c) for c in children_tokens)
        top_lp, top_tok = node_logp.topk(min(widest, node_logp.shape[-1]), dim=-1)
        top_lp, top_tok = top_lp.tolist(), top_tok.tolist()
        for u in range(n):
            if depth[u] >= max_depth:
                continue
            added = 0
            for lp, tok in zip(top_lp[u], top_tok[u]):
                if added == extend:
                    break
                if tok in children_tokens[u]:
                    continue
                new_tokens.append(tok)
                new_parents.append(u)
                new_depth.append(depth[u] + 1)
                new_scores.append(scores[u] + lp)
                added += 1
    dev = candidates.device
    return DraftTree(tokens=torch.tensor(new_tokens, dtype=torch.long, device=dev),
                     parents=torch.tensor(new_parents, dtype=torch.long, device=dev),
                     depth=torch.tensor(new_depth, dtype=torch.long, device=dev),
                     scores=torch.tensor(new_scores, dtype=torch.float64, device=dev))


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

    def tree_from_scores(self, anchor: int, logp: Tensor, policy: TreePolicy, budget: int,
                         path_logp: Callable[[DraftTree], Tensor]) -> DraftTree:
        candidates = policy.build(DepthScores(anchor, logp), self.candidates or budget)  # from pass 1
        node_logp = path_logp(candidates)  # pass 2: [N, V]
        scored = rescore_tree(candidates, node_logp, self.extend, max_depth=self.block_size)
        return policy.select(scored, budget)
