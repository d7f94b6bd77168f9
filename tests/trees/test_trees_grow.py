"""Growing trees with an autoregressive drafter (`expand` callback): every registered policy that
declares can_grow keeps the callback contract and the tree invariants; eagle2 against a brute-force
EAGLE-2, chain = greedy drafting, static = per-node ranks; frontier_subtree."""

from __future__ import annotations

import pytest
import torch
from components import policy_cases
from hypothesis import given, settings
from hypothesis import strategies as st
from trees_reference import check_invariants, depth_scores, eagle2, f32, node_paths, ranked_ids

from specbench.trees import TREE_POLICIES, DraftTree, TreeError, frontier_subtree, grow_tree
from specbench.trees.base import DepthScores


class ToyDrafter:
    """An autoregressive 'model': next-token log-probs are a fixed random function of the token path
    (with exact ties when `ties`). As `expand` it checks the contract: one depth per call, in order from
    the root, and every ancestor of a frontier node was expanded by an earlier call."""

    def __init__(self, vocab: int, seed: int, ties: bool) -> None:
        self.vocab, self.seed, self.ties = vocab, seed, ties
        self.expanded: set[int] = set()
        self.calls = 0

    def logp_of(self, path: tuple[int, ...]) -> list[float]:
        g = torch.Generator().manual_seed(hash((self.seed,) + path) & 0x7FFFFFFF)
        if self.ties:
            logits = torch.randint(0, 3, (self.vocab,), generator=g).float()
        else:
            logits = torch.randn(self.vocab, generator=g) * 2
        return torch.log_softmax(logits, -1).tolist()

    def expand(self, tree: DraftTree, frontier: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        tree.validate()
        ids = frontier.tolist()
        assert {tree.host[2][i] for i in ids} == {self.calls - 1}, "a frontier is one depth, the p-th call's p - 1"
        for node in ids:
            assert set(tree.path_to(node)[:-1]) <= self.expanded, "ancestors are expanded first"
        self.expanded |= set(ids)
        paths = node_paths(tree)
        return torch.tensor([self.logp_of(paths[i]) for i in ids])


def records(tree: DraftTree) -> list[tuple[tuple[int, ...], float]]:
    paths, scores = node_paths(tree), tree.scores.tolist()
    return [(paths[i], scores[i]) for i in range(1, tree.num_nodes)]


GROWING = policy_cases(growing=True)


@pytest.mark.parametrize("name,args", GROWING, ids=[f"{n}{a}" for n, a in GROWING])
@settings(max_examples=30, deadline=None)
@given(vocab=st.integers(1, 6), seed=st.integers(0, 10**6), ties=st.booleans(), budget=st.integers(0, 30),
       drafter_depth=st.integers(0, 5))
def test_growing_policy_invariants(name: str, args: dict, vocab: int, seed: int, ties: bool, budget: int,
                                   drafter_depth: int) -> None:
    """One depth per expand call, ancestors first (ToyDrafter checks), at most `budget` nodes within the
    drafter's depth, the anchor at the root, scores never rising from parent to child."""
    toy = ToyDrafter(vocab, seed, ties)
    tree = grow_tree(TREE_POLICIES.build(name, **args), 11, toy.expand, budget, drafter_depth)
    tree.validate()
    check_invariants(tree, drafter_depth)
    assert tree.budget <= budget and tree.tokens[0] == 11
    assert tree.scores is not None and bool((tree.scores[1:] <= tree.scores[tree.parents[1:]]).all())
    assert toy.calls <= drafter_depth


@settings(max_examples=80, deadline=None)
@given(vocab=st.integers(1, 6), seed=st.integers(0, 10**6), ties=st.booleans(), budget=st.integers(0, 30),
       top_k=st.integers(1, 4), depth=st.integers(1, 5), drafter_depth=st.integers(0, 5))
def test_eagle2_grow_equals_brute_force(vocab: int, seed: int, ties: bool, budget: int, top_k: int, depth: int,
                                        drafter_depth: int) -> None:
    toy = ToyDrafter(vocab, seed, ties)
    policy = TREE_POLICIES.build("eagle2", top_k=top_k, max_depth=depth)
    tree = grow_tree(policy, 11, toy.expand, budget, drafter_depth)
    check_invariants(tree, min(depth, drafter_depth))
    assert records(tree) == eagle2(11, toy.logp_of, budget, top_k, min(depth, drafter_depth))
    assert toy.calls == min(depth, drafter_depth, budget)  # one model pass per depth


@settings(max_examples=40, deadline=None)
@given(vocab=st.integers(1, 6), seed=st.integers(0, 10**6), ties=st.booleans(), budget=st.integers(0, 8),
       drafter_depth=st.integers(0, 6))
def test_chain_grow_is_greedy_drafting(vocab: int, seed: int, ties: bool, budget: int, drafter_depth: int) -> None:
    toy = ToyDrafter(vocab, seed, ties)
    tree = grow_tree(TREE_POLICIES.build("chain"), 3, toy.expand, budget, drafter_depth)
    path: tuple[int, ...] = ()
    for _ in range(min(budget, drafter_depth)):
        path += (ranked_ids(toy.logp_of(path))[0],)
    assert node_paths(tree)[-1] == path and tree.budget == len(path)


@settings(max_examples=40, deadline=None)
@given(vocab=st.integers(1, 6), seed=st.integers(0, 10**6), ties=st.booleans(), budget=st.integers(0, 40),
       drafter_depth=st.integers(0, 6))
def test_static_grow_takes_each_nodes_own_ranks(vocab: int, seed: int, ties: bool, budget: int,
                                                drafter_depth: int) -> None:
    toy = ToyDrafter(vocab, seed, ties)
    policy = TREE_POLICIES.build("static", tree="default-31")
    tree = grow_tree(policy, 3, toy.expand, budget, drafter_depth)
    check_invariants(tree, drafter_depth)
    expected = []  # (token path, score) in template order
    for ranks in policy.paths:
        if len(ranks) > min(drafter_depth, budget) or any(r >= vocab for r in ranks):
            continue
        path, score = (), 0.0
        for r in ranks:
            row = toy.logp_of(path)
            tok = ranked_ids(row)[r]
            path, score = path + (tok,), f32(score + min(f32(row[tok]), 0.0))
        expected.append((path, score))
    keep = sorted(range(len(expected)), key=lambda i: (-expected[i][1], i))[:budget]
    assert records(tree) == [expected[i] for i in sorted(keep)]


@settings(max_examples=60, deadline=None)
@given(scores=depth_scores(max_depth=5, max_vocab=6), budget=st.integers(0, 30), top_k=st.integers(1, 4))
def test_eagle2_build_is_grow_on_factorised_scores(scores: DepthScores, budget: int, top_k: int) -> None:
    policy = TREE_POLICIES.build("eagle2", top_k=top_k, max_depth=4)
    built = policy.build(scores, budget)
    grown = policy.grow(scores.anchor, lambda tree, frontier: scores.logp[tree.depth[frontier]], budget, scores.depth)
    assert records(built) == records(grown)
    chain = TREE_POLICIES.build("chain")
    assert node_paths(chain.build(scores, budget)) == node_paths(
        chain.grow(scores.anchor, lambda tree, frontier: scores.logp[tree.depth[frontier]], budget, scores.depth))


def test_frontier_subtree_is_the_union_of_root_paths() -> None:
    tree = DraftTree.from_paths(9, [[1, 2, 3], [1, 4], [5, 6], [5, 7, 8]])
    frontier = torch.tensor([3, 7])  # nodes: 1:1 2:2 3:3 4:4 5:5 6:6 7:7 8:8 by insertion
    sub, rows = frontier_subtree(tree, frontier)
    kept = [0, 1, 2, 3, 5, 7]
    assert sub.tokens.tolist() == tree.tokens[kept].tolist()
    assert sub.tokens[rows].tolist() == tree.tokens[frontier].tolist()
    assert sub.ancestor_mask[rows].sum(-1).tolist() == [4, 3]  # each row sees its own root path only


def test_policies_that_cannot_grow_say_which_can() -> None:
    toy = ToyDrafter(5, 0, False)
    with pytest.raises(TreeError, match="chain, eagle2, static"):
        grow_tree(TREE_POLICIES.build("ddtree"), 1, toy.expand, 8, 4)
    with pytest.raises(TreeError, match="log-probs"):
        grow_tree(TREE_POLICIES.build("eagle2"), 1, lambda tree, frontier: torch.zeros(5), 8, 4)
