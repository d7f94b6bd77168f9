"""Exact-enumeration property tests: every lossless verifier emits exactly the target's law (1e-12).

Fixed trees (any shape, duplicate siblings, point-mass drafts): exact_law == target_law, the law of
ancestral sampling walked down the tree. Sampled trees (children drawn from random draft laws with or
without replacement; the sampler's draws are enumerated too): every emitted next token follows the
target given its prefix (next_token_gap == 0, equivalent to "the emitted block continued by
ancestral sampling has the ancestral law"). Negative controls show the same checks catch lossy rules.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verify_cases import RandomDraftLaw, RandomLaw, depths, shapes, support_caps, tree_from

from specbench.verify import (
    VERIFIERS,
    ar_law,
    exact_law,
    extend_law,
    law_gap,
    next_token_gap,
    sample_tree,
    target_law,
)

TOL = 1e-12
FIXED_TREE_VERIFIERS = ["sample-walk", "tree-rrs", "tree-rrs-pointmass", "traversal"]
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@st.composite
def fixed_cases(draw: st.DrawFn, chain: bool = False):  # type: ignore[no-untyped-def]
    vocab = draw(st.integers(2, 7))
    shape = draw(shapes(chain=chain))
    tokens = [draw(st.integers(0, vocab - 1)) for _ in shape]
    target = RandomLaw(draw(st.integers(0, 2**32 - 1)), vocab)
    return tree_from(shape, tokens), target


@settings(max_examples=60, **SETTINGS)
@given(case=fixed_cases(), name=st.sampled_from(FIXED_TREE_VERIFIERS))
def test_fixed_tree_point_mass_law_is_target_law(case, name) -> None:
    tree, target = case
    law = exact_law(VERIFIERS.build(name), tree, target)
    assert law_gap(law, target_law(tree, target)) < TOL
    assert abs(sum(law.values()) - 1.0) < TOL


@settings(max_examples=30, **SETTINGS)
@given(case=fixed_cases(chain=True))
def test_chain_rs_point_mass_law_is_target_law(case) -> None:
    tree, target = case
    law = exact_law(VERIFIERS.build("chain-rs"), tree, target)
    assert law_gap(law, target_law(tree, target)) < TOL


@settings(max_examples=30, **SETTINGS)
@given(case=fixed_cases())
def test_greedy_law_is_the_argmax_walk(case) -> None:
    """At T = 0 the processed law is one-hot on the argmax (lowest id among exact ties)."""
    tree, target = case
    rows = torch.stack([target(p) for p in _paths(tree)])
    one_hot = torch.nn.functional.one_hot(rows.argmax(-1), rows.shape[-1]).double()
    law = exact_law(VERIFIERS.build("greedy"), tree, rows)
    assert law == target_law(tree, one_hot)
    assert len(law) == 1


@st.composite
def sampled_cases(draw: st.DrawFn, chain: bool = False, max_trees: int = 128):  # type: ignore[no-untyped-def]
    vocab = draw(st.integers(2, 7))
    shape = draw(shapes(chain=chain))
    wanted = [draw(st.integers(min(2, vocab), min(3, vocab))) for _ in range(5)]
    caps = support_caps(shape, wanted, max_trees)
    target = RandomLaw(draw(st.integers(0, 2**32 - 1)), vocab)
    draft = RandomDraftLaw(draw(st.integers(0, 2**32 - 1)), target, lambda depth: caps[depth])
    return shape, target, draft


@settings(max_examples=50, **SETTINGS)
@given(case=sampled_cases(), name=st.sampled_from(["tree-rrs", "traversal"]), replacement=st.booleans())
def test_sampled_tree_every_next_token_follows_target(case, name, replacement) -> None:
    shape, target, draft = case
    law = exact_law(VERIFIERS.build(name), lambda rng: sample_tree(0, draft, shape, rng, replacement), target)
    assert next_token_gap(law, target) < TOL
    assert abs(sum(law.values()) - 1.0) < TOL


@settings(max_examples=25, **SETTINGS)
@given(case=sampled_cases(chain=True), name=st.sampled_from(["chain-rs", "traversal"]))
def test_sampled_chain_every_next_token_follows_target(case, name) -> None:
    shape, target, draft = case
    law = exact_law(VERIFIERS.build(name), lambda rng: sample_tree(0, draft, shape, rng), target)
    assert next_token_gap(law, target) < TOL


@settings(max_examples=15, **SETTINGS)
@given(case=sampled_cases(chain=True))
def test_tree_rrs_on_a_chain_is_chain_rs(case) -> None:
    shape, target, draft = case
    laws = [exact_law(VERIFIERS.build(name), lambda rng: sample_tree(0, draft, shape, rng), target)
            for name in ("tree-rrs", "chain-rs")]
    assert law_gap(*laws) < TOL


@settings(max_examples=25, **SETTINGS)
@given(case=sampled_cases(chain=True))
def test_traversal_accepts_at_least_as_much_as_chain_rs_on_chains(case) -> None:
    """On a chain, traversal is block verification, which is never worse than token-wise
    speculative sampling in expected tokens per pass (Sun et al. 2024)."""
    shape, target, draft = case

    def mean_length(name: str) -> float:
        law = exact_law(VERIFIERS.build(name), lambda rng: sample_tree(0, draft, shape, rng), target)
        return sum(len(seq) * p for seq, p in law.items())
    assert mean_length("traversal") >= mean_length("chain-rs") - TOL


@settings(max_examples=10, **SETTINGS)
@given(case=sampled_cases(max_trees=12), name=st.sampled_from(["tree-rrs", "traversal", "argmax-match"]))
def test_next_token_gap_agrees_with_ar_law_comparison(case, name) -> None:
    """The cheap criterion and the literal one (continue every emitted block by ancestral sampling,
    compare with ancestral sampling) agree, for lossless and lossy rules alike."""
    shape, target, draft = case
    law = exact_law(VERIFIERS.build(name), lambda rng: sample_tree(0, draft, shape, rng), target)
    length = max(depths(shape)) + 1
    literal = law_gap(extend_law(law, target, length), ar_law(target, length))
    assert (next_token_gap(law, target) < TOL) == (literal < TOL)


@pytest.mark.slow
def test_large_sampled_tree_depth4_twelve_nodes() -> None:
    """One case at the full size (12 nodes, depth 4, two-token draft supports at every node, 2048
    trees) for each rejection rule and both sampling schemes."""
    shape = [-1, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8]
    target = RandomLaw(11, 5)

    def draft(path: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash(path) % 2**31)
        law = torch.zeros(5, dtype=torch.float64)
        law[torch.randperm(5, generator=g)[:2]] = torch.rand(2, generator=g, dtype=torch.float64) + 0.1
        return law

    for name in ["tree-rrs", "traversal"]:
        for replacement in (True, False):
            sampler = lambda rng: sample_tree(0, draft, shape, rng, replacement)  # noqa: E731
            assert next_token_gap(exact_law(VERIFIERS.build(name), sampler, target), target) < TOL


# ---- negative controls: the same checks fail for lossy rules ------------------------------------
def test_lossy_argmax_match_is_caught() -> None:
    """p = (0.5, 0.3, 0.2), one child drawn from q = (0.6, 0.4, 0): token 0 comes first with
    probability 0.6 + 0.4 * 0.5 = 0.8."""
    target = lambda path: torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)  # noqa: E731
    q = torch.tensor([0.6, 0.4, 0.0], dtype=torch.float64)
    law = exact_law(VERIFIERS.build("argmax-match"), lambda rng: sample_tree(0, lambda path: q, [-1, 0], rng), target)
    first = sum(p for seq, p in law.items() if seq[0] == 0)
    assert abs(first - 0.8) < TOL and next_token_gap(law, target) > 0.29
    assert not VERIFIERS.get("argmax-match").lossless


def test_rrs_with_rows_that_lie_is_caught() -> None:
    """Greedy (argmax) drafting that records q as if it had sampled (methods.md V2's warning), and a
    without-replacement sampler whose rows keep the base q: both are lossy under tree-rrs."""
    vocab = 4
    target = lambda path: torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)  # noqa: E731
    q = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    greedy_chain = tree_from([-1, 0], [0, int(q.argmax())])
    greedy_chain.draft_probs = torch.stack([q, q])
    law = exact_law(VERIFIERS.build("chain-rs"), greedy_chain, torch.stack([target(()), target(())]))
    assert next_token_gap(law, target) > 1e-3

    def base_rows(rng):  # type: ignore[no-untyped-def]
        tree = sample_tree(0, lambda path: q, [-1, 0, 0], rng, replacement=False)
        tree.draft_probs = q.expand(tree.num_nodes, vocab).clone()
        return tree

    law = exact_law(VERIFIERS.build("tree-rrs"), base_rows, target)
    assert next_token_gap(law, target) > 1e-3


def test_deduplicating_a_with_replacement_draw_is_caught() -> None:
    """Merging duplicate siblings after drawing (pruning by the drawn tokens) breaks tree-rrs; keeping
    them (the representation specbench uses) is exact."""
    target = lambda path: torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)  # noqa: E731
    q = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)

    def deduplicated(rng):  # type: ignore[no-untyped-def]
        tree = sample_tree(0, lambda path: q, [-1, 0, 0, 0], rng)
        keep, seen = [0], set()
        for i, t in enumerate(tree.tokens.tolist()[1:], start=1):
            if t not in seen:
                seen.add(t)
                keep.append(i)
        return tree.subtree(keep)

    rrs = VERIFIERS.build("tree-rrs")
    assert next_token_gap(exact_law(rrs, deduplicated, target), target) > 1e-3
    kept = lambda rng: sample_tree(0, lambda path: q, [-1, 0, 0, 0], rng)  # noqa: E731
    assert next_token_gap(exact_law(rrs, kept, target), target) < TOL


def _paths(tree):  # type: ignore[no-untyped-def]
    from specbench.verify.exact import node_paths

    return node_paths(tree)


@pytest.mark.parametrize("name", ["greedy", "sample-walk", "chain-rs", "tree-rrs", "tree-rrs-pointmass", "traversal"])
def test_registered_lossless(name: str) -> None:
    assert VERIFIERS.get(name).lossless
