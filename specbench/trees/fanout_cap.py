"""`fanout-cap`: JetSpec's best-first builder with a cap b_d on the children each popped node gets.

Rules for the caps (b_d caps the children at depth d+1, d = 0..D-1):
  fixed    b_d = caps[d] (depths past the list: the full width K)
  top2gap  JetSpec's "low-budget winner" (jetspec/tree/tree_to_chain/fanout_cap/top2gap.py):
           g_d = logp_d^(1) - logp_d^(2) (the top-2 gap of the children's depth),
           b_d = max(1, round(K * sigmoid(-beta * (g_d - g0)))); a decisive depth (large gap) becomes a
           chain, an undecided one fans out. Defaults beta=1, g0=1 (JetSpec's benchmark used beta=2);
           round() is Python's (half to even), as in JetSpec. K < 2: every cap is 1.
Caps of K at every depth give exactly `accum-logp`.

Host policy: the heap runs on the host over a table read back from the device, so in the GPU round a
parallel drafter under it drafts eagerly (its tree is then copied in; `capturable` is False).
"""

from __future__ import annotations

import math
from typing import Sequence

from specbench.trees import TREE_POLICIES
from specbench.trees.accum_logp import build_capped, check_width
from specbench.trees.base import DepthScores, DraftTree, TreeError, TreePolicy, check_budget
from specbench.trees.ranking import host_table

RULES = ("top2gap", "fixed")


def top2gap_caps(logp: Sequence[Sequence[float]], beta: float, g0: float) -> list[int]:
    """b_d = max(1, round(K * sigmoid(-beta * (g_d - g0)))) from a ranked table logp [D][K]."""
    caps = []
    for row in logp:
        width = len(row)
        if width < 2:
            caps.append(1)
            continue
        arg = -beta * ((row[0] - row[1]) - g0)
        sigmoid = 1.0 / (1.0 + math.exp(-arg)) if arg >= 0 else math.exp(arg) / (1.0 + math.exp(arg))
        caps.append(max(1, int(round(width * sigmoid))))
    return caps


@TREE_POLICIES.register("fanout-cap")
class FanoutCapPolicy(TreePolicy):
    """accum-logp with per-depth fan-out caps: `rule="top2gap"` (default) or `rule="fixed", caps=[...]`."""

    name = "fanout-cap"
    can_grow = False
    examples = ({}, {"width": 3, "beta": 2.0, "g0": 0.5}, {"rule": "fixed", "caps": [2, 1, 3], "width": 4})

    def __init__(self, width: int = 7, rule: str = "top2gap", caps: Sequence[int] | None = None,
                 beta: float = 1.0, g0: float = 1.0) -> None:
        self.width = check_width(width)
        if rule not in RULES:
            raise TreeError(f"fanout-cap rule must be one of {list(RULES)}, got {rule!r}")
        if (rule == "fixed") != (caps is not None):
            raise TreeError("fanout-cap: give caps=[b_0, b_1, ...] exactly when rule='fixed'")
        if caps is not None and any(isinstance(c, bool) or int(c) != c or c < 1 for c in caps):
            raise TreeError(f"fanout-cap caps must be integers >= 1, got {list(caps)}")
        if not (math.isfinite(beta) and math.isfinite(g0)):
            raise TreeError(f"fanout-cap beta and g0 must be finite, got {beta}, {g0}")
        self.rule, self.beta, self.g0 = rule, float(beta), float(g0)
        self.caps = [int(c) for c in caps] if caps is not None else None

    def depth_caps(self, logp: Sequence[Sequence[float]]) -> list[int]:
        """b_d for each depth of a ranked host table logp [D][K]."""
        if self.caps is not None:
            return [self.caps[d] if d < len(self.caps) else self.width for d in range(len(logp))]
        return top2gap_caps(logp, self.beta, self.g0)

    def build(self, scores: DepthScores, budget: int) -> DraftTree:
        budget = check_budget(budget)
        tok, lp = host_table(*scores.topk(self.width))
        return build_capped(scores.anchor, tok, lp, self.depth_caps(lp), budget, scores.logp.device)
