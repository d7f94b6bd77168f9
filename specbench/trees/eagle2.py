"""`eagle2`: EAGLE-2's dynamic tree (SafeAILab/EAGLE `topK_genrate`).

k beams per depth: the root's top-k children are the first beams; each beam's top-k children are
scored by cumulative draft log-prob, all k*k become candidates and the global top-k of them the next
beams; the final tree is the top-`budget` candidates by cumulative score. EAGLE-2's defaults are
top_k=10, depth=7 (= 8 expanded frontiers here: `max_depth=8`), total_token=60 (= budget 60).

With an autoregressive drafter the tree grows through `expand` (see `specbench.trees.grow`); with a
parallel drafter's per-depth scores (`build`), every node of a depth gets that depth's distribution,
which makes eagle2 a beam-pruned `ddtree`.
"""

from __future__ import annotations

import torch

from specbench.trees import TREE_POLICIES
from specbench.trees.base import DepthScores, DraftTree, TreeError, TreePolicy, check_budget
from specbench.trees.grow import ExpandFn, beam_grow, factorised_topk, ranked_expand


@TREE_POLICIES.register("eagle2")
class Eagle2Policy(TreePolicy):
    """Beam expansion (`top_k` beams and children per beam) up to `max_depth`, then global top-B."""

    name = "eagle2"
    can_grow = True
    examples = ({"top_k": 2, "max_depth": 3}, {})

    def __init__(self, top_k: int = 10, max_depth: int = 8) -> None:
        for label, value in (("top_k", top_k), ("max_depth", max_depth)):
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise TreeError(f"eagle2 {label} must be an integer >= 1, got {value!r}")
        self.top_k, self.max_depth = int(top_k), int(max_depth)

    def capturable(self, device: torch.device) -> bool:
        return True

    def grow(self, anchor: int, expand: ExpandFn, budget: int, max_depth: int,
             device: torch.device | str = "cpu") -> DraftTree:
        return beam_grow(anchor, ranked_expand(expand), check_budget(budget), self.top_k,
                         min(self.max_depth, max_depth), device)

    def build(self, scores: DepthScores, budget: int) -> DraftTree:
        return beam_grow(scores.anchor, factorised_topk(scores.check()), check_budget(budget), self.top_k,
                         min(self.max_depth, scores.depth), scores.logp.device)
