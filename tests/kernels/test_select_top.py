"""select_top (one program, or ranks over programs then one compacting program) against `select_top_scores`'
tensor ops: the same nodes, order and arrays."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not importable: the kernel tests need it (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from kernel_cases import random_parents  # noqa: E402

from specbench.kernels.select_top import MAX_NODES, ONE_PROGRAM_MAX_NODES, select_top  # noqa: E402
from specbench.trees.base import DraftTree, select_top_scores, select_top_scores_kernel  # noqa: E402


def _scored_tree(n: int, g: torch.Generator, levels: int | None) -> DraftTree:
    """Scores that never rise from parent to child; `levels` few distinct values (many ties, -inf included)."""
    parents = random_parents(n, g, max_back=None if n % 2 else 4)
    step = torch.rand(n, generator=g) if levels is None else torch.randint(0, 2, (n,), generator=g).float()
    scores = torch.zeros(n)
    depth = torch.zeros(n, dtype=torch.long)
    for i in range(1, n):
        p = int(parents[i])
        scores[i] = scores[p] - step[i]
        depth[i] = depth[p] + 1
    if levels is not None:
        scores[torch.rand(n, generator=g) < 0.2] = -torch.inf  # padding-like nodes
        for i in range(1, n):  # keep the contract: a child never outscores its parent
            scores[i] = torch.minimum(scores[i], scores[int(parents[i])])
    return DraftTree(tokens=torch.randint(0, 50, (n,), generator=g), parents=parents, depth=depth, scores=scores,
                     depth_bound=int(depth.max()), meta={"padded": True})


@pytest.mark.parametrize("n", [3, 17, 65, 129, 300])
@pytest.mark.parametrize("levels", [None, 2])
@pytest.mark.parametrize("one_program", [True, False], ids=["one-program", "two-launch"])
def test_the_same_nodes_in_the_same_order(device, n: int, levels: int | None, one_program: bool) -> None:
    g = torch.Generator().manual_seed(n * 7 + (levels or 0))
    tree = _scored_tree(n, g, levels)
    for budget in sorted({0, 1, n // 3, n - 2}):
        want = select_top_scores(tree, budget)  # the tensor ops, on the CPU
        got = [t.cpu() for t in select_top(*(t.to(device) for t in (tree.tokens, tree.parents, tree.depth, tree.scores)),
                                           budget, one_program=one_program)]
        for name, g_t in zip(("tokens", "parents", "depth", "scores"), got):
            assert torch.equal(g_t, getattr(want, name)), (name, budget)


@pytest.mark.parametrize("n, budget", [(513, 64), (711, 64), (MAX_NODES, 256)])
def test_the_sizes_past_one_program(device, n: int, budget: int) -> None:
    """Prompt lookup's trie at budget 64 (513 nodes), eagle3's candidates (711), the limit: the default path (two
    launches past ONE_PROGRAM_MAX_NODES) equals the tensor ops, ties and -inf included."""
    assert n > ONE_PROGRAM_MAX_NODES
    tree = _scored_tree(n, torch.Generator().manual_seed(n), 2)
    want = select_top_scores(tree, budget)
    got = select_top(*(t.to(device) for t in (tree.tokens, tree.parents, tree.depth, tree.scores)), budget)
    for name, g_t in zip(("tokens", "parents", "depth", "scores"), got):
        assert torch.equal(g_t.cpu(), getattr(want, name)), name


def test_the_tree_path_keeps_meta_and_bound_and_stops_at_its_limit(device) -> None:
    g = torch.Generator().manual_seed(1)
    tree = _scored_tree(40, g, None)
    moved = DraftTree(tokens=tree.tokens.to(device), parents=tree.parents.to(device), depth=tree.depth.to(device),
                      scores=tree.scores.to(device), depth_bound=tree.depth_bound, meta=dict(tree.meta))
    sub = select_top_scores_kernel(moved, 10)
    assert sub is not None and sub.num_nodes == 11 and sub.meta == {"padded": True} and sub.depth_bound == tree.depth_bound
    assert torch.equal(sub.parents.cpu(), select_top_scores(tree, 10).parents)
    big = _scored_tree(MAX_NODES + 1, g, None)
    assert select_top_scores_kernel(big, 10) is None  # past the kernel's limit: the tensor ops take it


def test_rejects_a_budget_that_keeps_everything_and_too_many_nodes(device) -> None:
    t = torch.zeros(5, dtype=torch.long, device=device)
    with pytest.raises(ValueError, match="budget"):
        select_top(t, t - 1, t, torch.zeros(5, device=device), 4)
    big = torch.zeros(MAX_NODES + 1, dtype=torch.long, device=device)
    with pytest.raises(ValueError, match="nodes"):
        select_top(big, big - 1, big, torch.zeros(MAX_NODES + 1, device=device), 4)
