"""Draft trees and tree policies: the shape of what the target verifies.

Pure package: tensors in, tensors out. Imports torch, numpy, the registry and kernels/ (its Triton
kernels lazily, on CUDA; PyYAML, networkx and matplotlib lazily: template files, graphs, drawing); never
models/, drafters/, verify/ or the engine, so any engine can use it.

Contract (`trees.base.TreePolicy`): turn a drafter's scores into a DraftTree (node 0 = the anchor,
parents before children) with at most `budget` draft nodes, root excluded, whose `scores` never rise
from parent to child:
  build(DepthScores(anchor, logp [D, V]), budget)        parallel drafters: one row per depth
  build_batch(anchors [B], logp [B, D, V], budget)        B such trees at once (TreeBatch; default: a loop)
  grow(anchor, expand, budget, max_depth, device)         autoregressive drafters (trees.grow);
                                                          only policies that declare can_grow = True
  select(candidates, budget)                              drafters with their own scored candidates
Every policy declares `can_grow` (no default) and may list `examples` (argument sets); the invariant
tests run over every registered policy and example (tests/trees).

Policies: chain, static, ddtree, ddtree-vec, accum-logp, fanout-cap, eagle2 (one module each;
docs/methods.md says what each computes).

Scores and ties (the same in every builder and in the brute-force references of tests/trees):
* A node's score is the float32 sum, root to node, of its tokens' log-probs clamped at 0 (one float32
  addition per depth), so a child never outscores its parent.
* Token ranks (per depth, or per parent for autoregressive drafters): higher log-prob first; equal
  log-probs: lower token id first.
* Within one depth d, nodes are ordered by score (higher first); equal scores: the node whose parent
  comes first in depth d-1's order, then the lower rank.
* Across depths (what a top-B cut keeps): score, then the shallower node, then the order above.
  `ddtree` pops nodes in exactly this order, `ddtree-vec` returns the same nodes in the same order.
* `accum-logp` / `fanout-cap` pop equal scores by lower node id (JetSpec's insertion counter);
  `select` keeps equal scores by lower node id.
"""

from specbench.registry import Registry

TREE_POLICIES: Registry = Registry("tree policy", "tree policies", base="specbench.trees.base:TreePolicy")
TREE_POLICIES.register("chain", "specbench.trees.chain:ChainPolicy")
TREE_POLICIES.register("static", "specbench.trees.static:StaticPolicy")
TREE_POLICIES.register("ddtree", "specbench.trees.ddtree:DDTreePolicy")
TREE_POLICIES.register("ddtree-vec", "specbench.trees.ddtree_vec:DDTreeVecPolicy")
TREE_POLICIES.register("accum-logp", "specbench.trees.accum_logp:AccumLogPPolicy")
TREE_POLICIES.register("fanout-cap", "specbench.trees.fanout_cap:FanoutCapPolicy")
TREE_POLICIES.register("eagle2", "specbench.trees.eagle2:Eagle2Policy")

from specbench.trees.base import DepthScores, DraftTree, TreeError, TreePolicy  # noqa: E402
from specbench.trees.grow import ExpandFn, frontier_subtree, grow_tree  # noqa: E402

__all__ = ["TREE_POLICIES", "DepthScores", "DraftTree", "ExpandFn", "TreeError", "TreePolicy",
           "frontier_subtree", "grow_tree"]
