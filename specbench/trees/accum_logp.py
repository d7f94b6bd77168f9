"""`accum-logp`: JetSpec's default builder (best-first on cumulative log-prob, full fan-out).

JetSpec (jetspec/tree/baselines/accum_logp.py) pops the node with the highest cumulative log-prob and
attaches *all* of its top-K children at once (the same per-depth top-K tokens under every parent),
until the budget is spent. Committing K children per pop is what makes it differ from `ddtree`: its
surrogate sum is at most the optimum. The loop with a per-depth cap on the children added per pop
(`build_capped`) is shared with `fanout-cap`; accum-logp is the cap K at every depth.

Budget: JetSpec's counts the root; here it does not (docs/DESIGN.md, "Conventions"), so JetSpec's 255 is our 254.
Ties: equal cumulative log-probs pop the lower node id first (JetSpec's insertion counter).

Host policy: the heap runs on the host over a table read back from the device, so in the GPU round a
parallel drafter under it drafts eagerly (its tree is then copied in; `capturable` is False).
"""

from __future__ import annotations

import heapq
from typing import Sequence

from specbench.trees import TREE_POLICIES
from specbench.trees.base import DepthScores, DraftTree, TreeError, TreePolicy, check_budget
from specbench.trees.ranking import f32_add, host_table


def build_capped(anchor: int, tokens: Sequence[Sequence[int]], logp: Sequence[Sequence[float]],
                 caps: Sequence[int], budget: int, device: object = "cpu") -> DraftTree:
    """JetSpec's heap loop over a ranked host table tokens/logp [D][K]: pop the best node (highest
    score, ties lower id); a node at depth d < D gets its first min(caps[d], K, room) children."""
    depth = len(tokens)
    width = len(tokens[0]) if depth else 0
    out_tokens, parents, depths, scores = [anchor], [-1], [0], [0.0]
    heap = [(-0.0, 0)]
    while heap and len(out_tokens) <= budget:
        neg, node = heapq.heappop(heap)
        d = depths[node]
        if d >= depth:
            continue
        for rank in range(min(caps[d], width, budget + 1 - len(out_tokens))):
            child = len(out_tokens)
            score = f32_add(-neg, logp[d][rank])
            out_tokens.append(tokens[d][rank])
            parents.append(node)
            depths.append(d + 1)
            scores.append(score)
            heapq.heappush(heap, (-score, child))
    return DraftTree.from_lists(out_tokens, parents, depths, scores, device)


def check_width(width: int) -> int:
    if isinstance(width, bool) or int(width) != width or width < 1:
        raise TreeError(f"width (children per node, JetSpec's tree_width) must be an integer >= 1, got {width!r}")
    return int(width)


@TREE_POLICIES.register("accum-logp")
class AccumLogPPolicy(TreePolicy):
    """Best-first on cumulative log-prob adding all `width` children of each popped node (JetSpec's
    default: width 7)."""

    name = "accum-logp"
    can_grow = False
    examples = ({}, {"width": 2})

    def __init__(self, width: int = 7) -> None:
        self.width = check_width(width)

    def build(self, scores: DepthScores, budget: int) -> DraftTree:
        budget = check_budget(budget)
        tok, lp = host_table(*scores.topk(self.width))
        return build_capped(scores.anchor, tok, lp, [self.width] * scores.depth, budget, scores.logp.device)
