"""`TreePolicy.build_batch` (B trees in one pass, what JetSpec++'s foresight stage builds every round)
returns, tree by tree, exactly what B separate `build` calls return: tokens, parents, depths, scores and
node order, ties included, for every registered policy (the batched builders of chain and ddtree-vec,
the default loop of the others)."""

from __future__ import annotations

import pytest
import torch

from specbench.trees import TREE_POLICIES
from specbench.trees.base import DepthScores, TreeBatch
from specbench.trees.ddtree_vec import build_top_b, build_top_b_batch

CASES = [(4, 5, 20, 6, False), (16, 15, 50, 16, False), (6, 3, 4, 10, True), (5, 6, 9, 64, True), (3, 8, 40, 3, False),
         (2, 1, 7, 0, False)]  # (B, D, V, budget, ties)


def _tables(b: int, depth: int, vocab: int, ties: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 3, (b, depth, vocab), generator=g).float() if ties else \
        3 * torch.randn(b, depth, vocab, generator=g)
    if ties:  # equal rows across outcomes and within a row: the tie rule decides everything
        raw[: b // 2] = raw[0]
    return torch.randint(0, vocab, (b,), generator=g), torch.log_softmax(raw, dim=-1)


def _assert_equal(batch: TreeBatch, trees: list, what: str) -> None:
    for i, tree in enumerate(trees):
        got = batch.tree(i)
        for name in ("tokens", "parents", "depth"):
            assert torch.equal(getattr(got, name), getattr(tree, name)), f"{what}: tree {i} {name}"
        assert (got.scores is None) == (tree.scores is None), f"{what}: tree {i} scores"
        if tree.scores is not None:
            assert torch.equal(got.scores, tree.scores), f"{what}: tree {i} scores"
        assert got.depth_bound == tree.depth_bound
        assert torch.equal(got.ancestor_mask, tree.ancestor_mask)
        assert torch.equal(batch.masks()[i], tree.ancestor_mask), f"{what}: tree {i} ancestor mask"


@pytest.mark.parametrize("name", ["chain", "ddtree-vec", "ddtree"])
@pytest.mark.parametrize("b, depth, vocab, budget, ties", CASES)
def test_build_batch_equals_one_build_per_tree(name: str, b: int, depth: int, vocab: int, budget: int,
                                               ties: bool) -> None:
    policy = TREE_POLICIES.build(name)
    for seed in range(2):
        anchors, logp = _tables(b, depth, vocab, ties, seed)
        want = [policy.build(DepthScores(anchors[i: i + 1], logp[i]), budget) for i in range(b)]
        _assert_equal(policy.build_batch(anchors, logp, budget), want, f"{name} {b}x{depth}x{vocab}/{budget}")


@pytest.mark.parametrize("b, depth, vocab, budget, ties", [c for c in CASES if c[3] > 0])
def test_build_top_b_batch_equals_build_top_b(b: int, depth: int, vocab: int, budget: int, ties: bool) -> None:
    anchors, logp = _tables(b, depth, vocab, ties, 7)
    k = min(budget, vocab)
    tables = [DepthScores(int(anchors[i]), logp[i, : min(depth, budget)]).topk(k) for i in range(b)]
    got = build_top_b_batch(anchors, torch.stack([t for t, _ in tables]), torch.stack([v for _, v in tables]), budget)
    _assert_equal(got, [build_top_b(int(anchors[i]), t, v, budget) for i, (t, v) in enumerate(tables)], "build_top_b")
