"""`static`: templates from Python, YAML and names; Medusa-style build; select on a scored trie."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trees_reference import depth_scores, f32, node_paths, ranked_table

from specbench.trees import TREE_POLICIES, DraftTree, TreeError
from specbench.trees.base import DepthScores
from specbench.trees.static import NAMED_TREES

PRIOR = [0.72, 0.10, 0.045, 0.028, 0.02, 0.015, 0.011, 0.009, 0.007, 0.006]


@pytest.mark.parametrize("name", sorted(NAMED_TREES))
def test_named_trees_are_ddtree_on_the_rank_prior(name: str) -> None:
    """The shipped templates are what their comment says: ddtree's top-B on the rank-prior table
    (token id = rank there, since the table is sorted)."""
    size = int(name.split("-")[1])
    logp = torch.full((6, 16), -30.0)
    logp[:, : len(PRIOR)] = torch.tensor(PRIOR).log()
    tree = TREE_POLICIES.build("ddtree").build(DepthScores(0, logp), size)
    derived = sorted(node_paths(tree)[1:], key=lambda p: (len(p), p))
    assert derived == NAMED_TREES[name]


def test_templates_from_python_yaml_and_names_agree(tmp_path) -> None:  # type: ignore[no-untyped-def]
    paths = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    listed = tmp_path / "tree.yaml"
    listed.write_text("- [0]\n- [1]\n- [0, 0]\n- [0, 1]\n- [1, 0]\n- [0, 0, 0]\n")
    mapping = tmp_path / "tree_map.yaml"
    mapping.write_text("paths: [[1, 0], [0], [0, 0, 0], [1], [0, 1], [0, 0]]\n")  # any order
    a = TREE_POLICIES.build("static", paths=paths)
    b = TREE_POLICIES.build("static", file=str(listed))
    c = TREE_POLICIES.build("static", file=str(mapping))
    assert a.paths == b.paths == c.paths == sorted((tuple(p) for p in paths), key=lambda p: (len(p), p))


@pytest.mark.parametrize("args,match", [
    ({}, "exactly one"),
    ({"paths": [[0]], "tree": "default-31"}, "exactly one"),
    ({"tree": "medusa"}, "default-31"),
    ({"paths": [[0], [0, 1, 2]]}, "prefix"),
    ({"paths": [[0], [0]]}, "twice"),
    ({"paths": [[0], [-1]]}, ">= 0"),
    ({"paths": [[]]}, "non-empty"),
    ({"file": "/nonexistent/tree.yaml"}, "does not exist"),
])
def test_bad_templates_fail_with_a_message(args: dict, match: str) -> None:
    with pytest.raises(TreeError, match=match):
        TREE_POLICIES.build("static", **args)


@settings(max_examples=60, deadline=None)
@given(scores=depth_scores(max_depth=4, max_vocab=6), budget=st.integers(0, 12))
def test_build_takes_each_depths_shared_ranks(scores: DepthScores, budget: int) -> None:
    paths = [[0], [1], [2], [0, 0], [0, 3], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]
    tree = TREE_POLICIES.build("static", paths=paths).build(scores, budget)
    ids, lp = ranked_table(scores.logp)
    expected = []  # (token path, score) in template order, within depth and vocabulary
    for ranks in sorted(paths, key=lambda p: (len(p), p)):
        if len(ranks) > scores.depth or any(r >= scores.vocab_size for r in ranks):
            continue
        score = 0.0
        for d, r in enumerate(ranks):
            score = f32(score + lp[d][r])
        expected.append((tuple(ids[d][r] for d, r in enumerate(ranks)), score))
    keep = sorted(range(len(expected)), key=lambda i: (-expected[i][1], i))[:budget]
    got_paths, got_scores = node_paths(tree)[1:], tree.scores[1:].tolist()
    assert list(zip(got_paths, got_scores)) == [expected[i] for i in sorted(keep)]


def test_select_keeps_template_rank_paths_of_a_scored_trie() -> None:
    trie = DraftTree.from_paths(0, [[5, 6], [7, 8, 9], [7, 1], [3]])  # ids: 5:1 6:2 7:3 8:4 9:5 1:6 3:7
    trie.scores = torch.tensor([0.0, -0.5, -0.9, -0.2, -0.4, -0.6, -1.5, -2.0])
    # root's children by score: 7 (rank 0), 5 (rank 1), 3 (rank 2); under 7: 8 (rank 0), 1 (rank 1)
    policy = TREE_POLICIES.build("static", paths=[[0], [1], [0, 0], [0, 0, 0], [1, 1]])
    kept = policy.select(trie, 10)
    assert sorted(node_paths(kept)[1:]) == sorted([(7,), (5,), (7, 8), (7, 8, 9)])
    assert node_paths(policy.select(trie, 2))[1:] == [(7,), (7, 8)]  # the two best scores
