"""ddtree and ddtree-vec return exactly the brute-force top-B tree (ties by the documented rule);
accum-logp / fanout-cap follow JetSpec's loop and never beat the optimum."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trees_reference import all_prefix_scores, capped_best_first, depth_scores, node_paths, top_b

from specbench.trees import TREE_POLICIES
from specbench.trees.base import DepthScores, DraftTree


def as_records(tree: DraftTree) -> list[tuple[tuple[int, ...], float, int]]:
    paths = node_paths(tree)
    scores = tree.scores.tolist()
    parents = tree.host[1]
    return [(paths[i], scores[i], parents[i] - 1) for i in range(1, tree.num_nodes)]


@settings(max_examples=150, deadline=None)
@given(scores=depth_scores(max_depth=4, max_vocab=6), budget=st.integers(0, 30))
def test_ddtree_and_vectorised_equal_brute_force_top_b(scores: DepthScores, budget: int) -> None:
    expected = top_b(scores.logp, budget)  # records in the global tie order
    for name in ("ddtree", "ddtree-vec"):
        tree = TREE_POLICIES.build(name).build(scores, budget)
        assert as_records(tree) == expected, name


@pytest.mark.parametrize("seed", range(4))
def test_vectorised_equals_heap_at_large_budgets(seed: int) -> None:
    """Budgets where the vectorised builder's candidate pruning matters (B ln B << B * K)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 40, (12, 3000), generator=g).float() / 4  # many exact ties
    scores = DepthScores(5, torch.log_softmax(logits, -1))
    for budget in (100, 257, 700):
        heap = TREE_POLICIES.build("ddtree").build(scores, budget)
        vec = TREE_POLICIES.build("ddtree-vec").build(scores, budget)
        for field in ("tokens", "parents", "depth", "scores"):
            assert torch.equal(getattr(heap, field), getattr(vec, field)), (budget, field)


def test_vectorised_equals_heap_on_drafter_sized_scores() -> None:
    """D=16, V=49152 Zipf-shaped rows (the benchmark's shape), budgets up to 1024."""
    g = torch.Generator().manual_seed(7)
    rank_logit = -torch.log1p(torch.arange(49152, dtype=torch.float32))
    rows = [(2.0 - 0.05 * d) * rank_logit[torch.randperm(49152, generator=g)] for d in range(16)]
    scores = DepthScores(2, torch.log_softmax(torch.stack(rows), -1))
    for budget in (16, 1024):
        heap = TREE_POLICIES.build("ddtree").build(scores, budget)
        vec = TREE_POLICIES.build("ddtree-vec").build(scores, budget)
        assert heap.budget == budget
        for field in ("tokens", "parents", "depth", "scores"):
            assert torch.equal(getattr(heap, field), getattr(vec, field)), (budget, field)


@settings(max_examples=100, deadline=None)
@given(scores=depth_scores(max_depth=4, max_vocab=6), budget=st.integers(1, 30),
       name_args=st.sampled_from([("accum-logp", {"width": 3}), ("accum-logp", {}), ("fanout-cap", {"width": 4}),
                                  ("fanout-cap", {"rule": "fixed", "caps": [1, 2], "width": 3})]))
def test_jetspec_builders_never_beat_the_optimum(scores: DepthScores, budget: int, name_args: tuple) -> None:
    name, args = name_args
    tree = TREE_POLICIES.build(name, **args).build(scores, budget)
    best = all_prefix_scores(scores.logp, min(budget, scores.vocab_size), min(scores.depth, budget))[:budget]
    got = sorted(tree.scores[1:].tolist(), reverse=True)
    # the i-th best score of any set of distinct prefixes is at most the i-th best prefix score
    assert all(g <= b for g, b in zip(got, best))
    surrogate = sum(math.exp(s) for s in got)
    assert surrogate <= sum(math.exp(s) for s in best) * (1 + 1e-12)


@settings(max_examples=100, deadline=None)
@given(scores=depth_scores(max_depth=4, max_vocab=6), budget=st.integers(0, 40), width=st.integers(1, 5),
       caps=st.one_of(st.none(), st.lists(st.integers(1, 5), min_size=0, max_size=4)))
def test_capped_builders_follow_jetspecs_loop(scores: DepthScores, budget: int, width: int,
                                              caps: list[int] | None) -> None:
    if caps is None:
        policy = TREE_POLICIES.build("accum-logp", width=width)
    else:
        policy = TREE_POLICIES.build("fanout-cap", rule="fixed", caps=caps, width=width)
    assert as_records(policy.build(scores, budget)) == capped_best_first(scores.logp, width, caps, budget)


def test_top2gap_caps_match_jetspecs_formula() -> None:
    logp = torch.log(torch.tensor([[0.90, 0.05, 0.03, 0.02], [0.40, 0.35, 0.15, 0.10], [0.5, 0.5, 0.0, 0.0]]))
    scores = DepthScores(3, logp)
    policy = TREE_POLICIES.build("fanout-cap", width=4, beta=2.0, g0=1.0)
    table = [[math.log(p) if p > 0 else -math.inf for p in row] for row in [[0.90, 0.05, 0.03, 0.02],
                                                                             [0.40, 0.35, 0.15, 0.10],
                                                                             [0.5, 0.5, 0.0, 0.0]]]
    expected = [max(1, round(4 / (1 + math.exp(2.0 * ((r[0] - r[1]) - 1.0))))) for r in table]
    assert expected == [1, 3, 4]  # decisive depth -> chain; undecided -> fan out
    tree = policy.build(scores, 100)
    kids, depth = tree.children, tree.host[2]
    for n in range(tree.num_nodes):
        if depth[n] < 3:
            assert len(kids[n]) == expected[depth[n]]
    identity = TREE_POLICIES.build("fanout-cap", width=4, beta=1.0, g0=1e9).build(scores, 30)
    accum = TREE_POLICIES.build("accum-logp", width=4).build(scores, 30)
    assert torch.equal(identity.tokens, accum.tokens) and torch.equal(identity.parents, accum.parents)
