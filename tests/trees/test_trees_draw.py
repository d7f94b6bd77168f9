"""draw_tree writes a PNG; the layered layout puts parents over their children without overlaps."""

from __future__ import annotations

import pytest
import torch

from specbench.trees import TREE_POLICIES
from specbench.trees.base import DepthScores, DraftTree
from specbench.trees.draw import draw_tree, tree_layout


def sample_tree() -> DraftTree:
    g = torch.Generator().manual_seed(0)
    scores = DepthScores(1, torch.log_softmax(torch.randn(5, 40, generator=g) * 2, -1))
    return TREE_POLICIES.build("ddtree").build(scores, 30)


def test_draw_tree_writes_a_png(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tree = sample_tree()
    labels = ["<anchor>"] + [f" tok{t}" if i % 3 else f"$x_{t}$\n" for i, t in enumerate(tree.host[0][1:])]
    deepest = max(range(tree.num_nodes), key=lambda i: tree.host[2][i])
    out = draw_tree(tree, labels, tree.path_to(deepest), tmp_path / "sub" / "tree.png", title="round 1", bonus="!")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert draw_tree(DraftTree.root_only(3), ["a"], None, tmp_path / "root.png").is_file()


def test_layout_is_layered_and_centred() -> None:
    tree = sample_tree()
    xy = tree_layout(tree)
    _, _, depth = tree.host
    assert [y for _, y in xy] == [-float(d) for d in depth]
    for node, kids in enumerate(tree.children):
        if kids:
            assert xy[node][0] == (xy[kids[0]][0] + xy[kids[-1]][0]) / 2
            assert [xy[k][0] for k in kids] == sorted(xy[k][0] for k in kids)
    for d in set(depth):  # distinct columns within a layer
        xs = [xy[i][0] for i in range(tree.num_nodes) if depth[i] == d]
        assert len(set(xs)) == len(xs)


def test_bad_labels_or_path_fail(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tree = sample_tree()
    labels = [str(t) for t in tree.host[0]]
    with pytest.raises(ValueError, match="labels"):
        draw_tree(tree, labels[:-1], None, tmp_path / "x.png")
    with pytest.raises(ValueError, match="root"):
        draw_tree(tree, labels, [1], tmp_path / "x.png")
    grandchild = next(i for i in range(tree.num_nodes) if tree.host[2][i] == 2)
    with pytest.raises(ValueError, match="not a child"):
        draw_tree(tree, labels, [0, grandchild], tmp_path / "x.png")
