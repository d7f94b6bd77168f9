"""Every policy, on random small tables: the DraftTree invariants, the exact budget, the depth
limit, and the ancestor mask against networkx reachability."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trees_reference import check_invariants, depth_scores

from specbench.trees import TREE_POLICIES, TreeError
from specbench.trees.base import DepthScores
from specbench.trees.fanout_cap import top2gap_caps
from specbench.trees.ranking import ranked_topk
from specbench.trees.static import NAMED_TREES, StaticPolicy


def expected_size(name: str, args: dict, scores: DepthScores, budget: int) -> int:
    """Draft nodes each policy must return: the budget, or every node its rule allows if fewer."""
    depth, vocab = scores.depth, scores.vocab_size
    if name == "chain":
        available = depth
    elif name in ("ddtree", "ddtree-vec"):
        width = min(budget, vocab)
        available = sum(width**d for d in range(1, min(depth, budget) + 1))
    elif name in ("accum-logp", "fanout-cap"):
        width = min(args.get("width", 7), vocab)
        if name == "accum-logp":
            caps = [width] * depth
        elif args.get("rule") == "fixed":
            caps = [min(args["caps"][d] if d < len(args["caps"]) else width, width) for d in range(depth)]
        else:
            table = ranked_topk(scores.logp, width)[0].clamp(max=0).tolist()
            caps = [min(c, width) for c in top2gap_caps(table, args.get("beta", 1.0), args.get("g0", 1.0))]
        available = sum(math.prod(caps[:d]) for d in range(1, depth + 1))
    elif name == "eagle2":
        width = min(args.get("top_k", 10), vocab)
        levels, frontier, available = min(args.get("max_depth", 8), depth, budget), 1, 0
        for _ in range(levels):
            available += frontier * width
            frontier = min(args.get("top_k", 10), frontier * width)
    elif name == "static":
        paths = NAMED_TREES[args["tree"]] if "tree" in args else args["paths"]
        available = sum(1 for p in paths if len(p) <= depth and all(r < vocab for r in p))
    else:
        raise AssertionError(name)
    return min(budget, available)


POLICIES = [
    ("chain", {}),
    ("ddtree", {}),
    ("ddtree-vec", {}),
    ("accum-logp", {}),
    ("accum-logp", {"width": 2}),
    ("fanout-cap", {}),
    ("fanout-cap", {"width": 3, "beta": 2.0, "g0": 0.5}),
    ("fanout-cap", {"rule": "fixed", "caps": [2, 1, 3], "width": 4}),
    ("eagle2", {"top_k": 2, "max_depth": 3}),
    ("eagle2", {}),
    ("static", {"tree": "default-31"}),
    ("static", {"paths": [[0], [2], [0, 1], [0, 1, 0], [2, 0], [0, 0]]}),
]


@pytest.mark.parametrize("name,args", POLICIES, ids=[f"{n}{a}" for n, a in POLICIES])
@settings(max_examples=60, deadline=None)
@given(scores=depth_scores(), budget=st.integers(0, 40))
def test_policy_invariants(name: str, args: dict, scores: DepthScores, budget: int) -> None:
    tree = TREE_POLICIES.build(name, **args).build(scores, budget)
    tree.validate()
    check_invariants(tree, scores.depth)
    assert tree.tokens[0] == scores.anchor
    assert tree.budget == expected_size(name, args, scores, budget)
    assert tree.scores is not None and tree.scores.shape == (tree.num_nodes,)
    # a child never outscores its parent (what makes top-B cuts closed under parents)
    parents = tree.parents[1:]
    assert bool((tree.scores[1:] <= tree.scores[parents]).all())


def test_bad_budget_and_arguments_fail_with_a_message() -> None:
    scores = DepthScores(1, torch.log_softmax(torch.randn(3, 5), -1))
    for name in TREE_POLICIES.names():
        args = {"tree": "default-31"} if name == "static" else {}
        with pytest.raises(TreeError, match="budget"):
            TREE_POLICIES.build(name, **args).build(scores, -1)
    with pytest.raises(TreeError, match="width"):
        TREE_POLICIES.build("accum-logp", width=0)
    with pytest.raises(TreeError, match="rule"):
        TREE_POLICIES.build("fanout-cap", rule="entropy")
    with pytest.raises(TreeError, match="caps"):
        TREE_POLICIES.build("fanout-cap", rule="fixed")
    with pytest.raises(TreeError, match="top_k"):
        TREE_POLICIES.build("eagle2", top_k=0)
    with pytest.raises(TreeError, match="float"):
        TREE_POLICIES.build("ddtree").build(DepthScores(1, torch.zeros(3, dtype=torch.long)), 4)
    with pytest.raises(TreeError, match="vocab"):
        TREE_POLICIES.build("ddtree-vec").build(DepthScores(1, torch.zeros(3, 0)), 4)
    with pytest.raises(ValueError, match="NaN"):
        TREE_POLICIES.build("ddtree").build(DepthScores(1, torch.full((2, 3), float("nan"))), 4)
    assert isinstance(TREE_POLICIES.build("static", tree="default-63"), StaticPolicy)
