"""Every registered tree policy (each argument set in its `examples`), on random small tables: the
DraftTree invariants, the budget, the depth limit, and the ancestor mask against networkx
reachability. For the built-in policies the tree's size is also checked against their rule."""

from __future__ import annotations

import math

import pytest
import torch
from components import policy_cases
from hypothesis import given, settings
from hypothesis import strategies as st
from trees_reference import check_invariants, depth_scores

from specbench.trees import TREE_POLICIES, TreeError
from specbench.trees.base import DepthScores
from specbench.trees.fanout_cap import top2gap_caps
from specbench.trees.ranking import ranked_topk
from specbench.trees.static import NAMED_TREES, StaticPolicy


def expected_size(name: str, args: dict, scores: DepthScores, budget: int) -> int | None:
    """Draft nodes a built-in policy must return: the budget, or every node its rule allows if fewer
    (None for a policy this oracle does not know)."""
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
        return None
    return min(budget, available)


POLICIES = policy_cases()


@pytest.mark.parametrize("name,args", POLICIES, ids=[f"{n}{a}" for n, a in POLICIES])
@settings(max_examples=60, deadline=None)
@given(scores=depth_scores(), budget=st.integers(0, 40))
def test_policy_invariants(name: str, args: dict, scores: DepthScores, budget: int) -> None:
    tree = TREE_POLICIES.build(name, **args).build(scores, budget)
    tree.validate()
    check_invariants(tree, scores.depth)
    assert tree.tokens[0] == scores.anchor
    size = expected_size(name, args, scores, budget)
    assert tree.budget <= budget and (size is None or tree.budget == size)
    assert tree.scores is not None and tree.scores.shape == (tree.num_nodes,)
    # a child never outscores its parent (what makes top-B cuts closed under parents)
    parents = tree.parents[1:]
    assert bool((tree.scores[1:] <= tree.scores[parents]).all())


@pytest.mark.parametrize("name,args", POLICIES, ids=[f"{n}{a}" for n, a in POLICIES])
@settings(max_examples=40, deadline=None)
@given(scores=depth_scores(min_depth=1), size=st.integers(0, 30), budget=st.integers(0, 40))
def test_policy_select_keeps_a_scored_subtree(name: str, args: dict, scores: DepthScores, size: int,
                                              budget: int) -> None:
    """select() on a scored candidate tree (what n-gram tries and re-scoring drafters hand over): at
    most `budget` of the candidates, closed under parents, with their own tokens and scores."""
    candidates = TREE_POLICIES.build("ddtree").build(scores, size)
    tree = TREE_POLICIES.build(name, **args).select(candidates, budget)
    tree.validate()
    assert tree.budget <= budget and tree.tokens[0] == scores.anchor
    paths = {tuple(candidates.tokens[candidates.path_to(i)].tolist()): float(candidates.scores[i])
             for i in range(candidates.num_nodes)}
    for i in range(tree.num_nodes):
        assert paths[tuple(tree.tokens[tree.path_to(i)].tolist())] == float(tree.scores[i])


def test_bad_budget_and_arguments_fail_with_a_message() -> None:
    scores = DepthScores(1, torch.log_softmax(torch.randn(3, 5), -1))
    for name, args in POLICIES:
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
