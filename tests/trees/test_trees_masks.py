"""A known ancestor mask travels with the tree: `subtree` restricts a computed one and jetspec-tree's
`rescore_tree` grows the candidates' one; both equal the mask of the parents (a walk up the parents)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specbench.drafters.heads.jetspec_tree import rescore_tree
from specbench.trees.base import DraftTree


def walked_mask(parents: list[int]) -> list[list[bool]]:
    """mask[i][j]: j is i or one of its ancestors."""
    n = len(parents)
    mask = [[False] * n for _ in range(n)]
    for i in range(n):
        j = i
        while j >= 0:
            mask[i][j] = True
            j = parents[j]
    return mask


@st.composite
def trees(draw: st.DrawFn) -> DraftTree:
    n = draw(st.integers(1, 24))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    tokens = draw(st.lists(st.integers(0, 11), min_size=n, max_size=n))
    return DraftTree.from_lists(tokens, parents, depth, [0.0] * n, "cpu")


@settings(max_examples=60, deadline=None)
@given(tree=trees(), data=st.data())
def test_subtree_restricts_a_computed_mask(tree: DraftTree, data: st.DataObject) -> None:
    parents = tree.parents.tolist()
    chosen = data.draw(st.sets(st.integers(0, tree.num_nodes - 1)))
    keep = {0}
    for node in chosen:  # closed under parents
        while node >= 0:
            keep.add(node)
            node = parents[node]
    assert tree.ancestor_mask is not None  # computed: the subtree inherits it
    sub = tree.subtree(sorted(keep))
    assert "ancestor_mask" in sub.__dict__
    assert sub.ancestor_mask.tolist() == walked_mask(sub.parents.tolist())
    assert "ancestor_mask" not in DraftTree.from_lists([1, 2], [-1, 0], [0, 1], None, "cpu").subtree([0]).__dict__


@settings(max_examples=40, deadline=None)
@given(tree=trees(), extend=st.integers(0, 3), seed=st.integers(0, 99))
def test_rescore_tree_grows_the_candidates_mask(tree: DraftTree, extend: int, seed: int) -> None:
    logp = torch.log_softmax(torch.randn(tree.num_nodes, 12, generator=torch.Generator().manual_seed(seed)), -1)
    out = rescore_tree(tree, logp, extend, max_depth=4).validate(allow_duplicate_siblings=True)
    assert "ancestor_mask" in out.__dict__
    assert out.ancestor_mask.tolist() == walked_mask(out.parents.tolist())
