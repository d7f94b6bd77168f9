"""The randomness primitives, the enumerator behind exact_law, and the tree sampler's rows."""

from __future__ import annotations

import pytest
import torch

from specbench.trees.base import DraftTree
from specbench.verify import (
    VERIFIERS,
    EnumeratingRandomness,
    ReplayRandomness,
    TorchRandomness,
    enumerate_law,
    exact_law,
    inverse_cdf,
    sample_tree,
)
from specbench.verify.exact import EnumerationError, enumerate_outcomes


def test_inverse_cdf_never_picks_a_zero_weight() -> None:
    w = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0], dtype=torch.float64)
    edge = [0.0, 0.25 - 2**-54, 0.25, 1.0 - 2**-53]
    assert [int(inverse_cdf(w, torch.tensor(u, dtype=torch.float64))) for u in edge] == [1, 1, 3, 3]
    grid = torch.arange(1000, dtype=torch.float64) / 1000
    picks = inverse_cdf(w.expand(1000, 5), grid)
    assert (picks == 1).sum() == 250 and (picks == 3).sum() == 750
    # unnormalised weights give the same draws as their normalised law
    assert torch.equal(inverse_cdf(3 * w, grid), picks)


def test_torch_randomness_is_reproducible_and_uniform_based() -> None:
    a, b = TorchRandomness(5), TorchRandomness(5)
    probs = torch.tensor([0.2, 0.5, 0.3])
    draws_a = [a.categorical(probs) for _ in range(20)] + [a.bernoulli(0.4) for _ in range(20)]
    draws_b = [b.categorical(probs) for _ in range(20)] + [b.bernoulli(0.4) for _ in range(20)]
    assert draws_a == draws_b
    u = TorchRandomness(5).uniform(2)
    c = TorchRandomness(5)
    assert c.categorical(probs) == int(inverse_cdf(probs, u[0])) and c.bernoulli(0.4) == bool(u[1] < 0.4)


def test_enumeration_of_a_small_program() -> None:
    def program(rng):  # type: ignore[no-untyped-def]
        if rng.bernoulli(0.25):
            return ("a", rng.categorical(torch.tensor([0.0, 2.0, 6.0])))
        return ("b", rng.bernoulli(1.0))

    law = enumerate_law(program)
    assert law == {("a", 1): 0.25 * 0.25, ("a", 2): 0.25 * 0.75, ("b", True): 0.75}
    assert len(list(enumerate_outcomes(program))) == 3  # zero-probability outcomes are not explored
    with pytest.raises(EnumerationError, match="more than 2 runs"):
        enumerate_law(program, max_runs=2)
    with pytest.raises(EnumerationError, match="sum"):
        EnumeratingRandomness().categorical(torch.zeros(3))
    with pytest.raises(NotImplementedError, match="discrete"):
        EnumeratingRandomness().uniform(3)


def test_replay_runs_out_loudly() -> None:
    replay = ReplayRandomness([0.5])
    assert replay.bernoulli(0.6) and replay.remaining == 0
    with pytest.raises(RuntimeError, match="left"):
        replay.bernoulli(0.5)


def test_sample_tree_rows_with_and_without_replacement() -> None:
    q = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    shape = [-1, 0, 0, 0, 0, 1]
    trees = dict(enumerate_outcomes(lambda rng: sample_tree(9, lambda path: q, shape, rng, replacement=True)))
    assert abs(sum(trees.values()) - 1) < 1e-12
    for tree, prob in trees.items():
        assert tree.num_nodes == 6 and torch.equal(tree.draft_probs[1:], q.expand(5, 4))
        assert abs(prob - float(torch.prod(q[tree.tokens[1:]]))) < 1e-15
    assert any(len(set(t.tokens[1:5].tolist())) < 4 for t in trees)  # duplicates occur
    without = list(enumerate_outcomes(lambda rng: sample_tree(9, lambda path: q, shape, rng, replacement=False)))
    assert abs(sum(p for _, p in without) - 1) < 1e-12
    for tree, _ in without:
        # three tokens have mass: the fourth root child is dropped; no duplicates; rows are conditional
        assert tree.parents.tolist() == [-1, 0, 0, 0, 1] and len(set(tree.tokens[1:4].tolist())) == 3
        tree.validate()
        first, second = tree.tokens[1:3].tolist()
        expect = q.clone()
        expect[first] = 0
        assert torch.allclose(tree.draft_probs[2], expect / expect.sum())
        assert tree.draft_probs[3, first] == 0 and tree.draft_probs[3, second] == 0
    with pytest.raises(ValueError, match="parents list"):
        sample_tree(0, lambda path: q, [-1, 1], TorchRandomness(0))


def test_exact_law_bad_arguments() -> None:
    with pytest.raises(ValueError, match="function path"):
        exact_law(VERIFIERS.build("tree-rrs"), lambda rng: DraftTree.root_only(0), torch.ones(1, 3))
    with pytest.raises(ValueError, match="rows"):
        exact_law(VERIFIERS.build("tree-rrs"), DraftTree.chain(0, [1]), torch.ones(3, 3))
