"""Exact-enumeration property tests: every registered lossless verifier emits exactly the target's
law (1e-12), on the shared case generator (verify_cases).

The suites run over `components.verifiers(lossless=True)`, each on the cases its declarations admit
(chains only for `chains_only`, one-hot target laws for a verifier whose `check` refuses T > 0).
The proof on fixed trees (any shape, duplicate siblings, point-mass drafts) and on sampled trees
(children drawn from random draft laws with or without replacement; the sampler's draws are
enumerated too) is the same: every emitted next token follows the target given its prefix
(next_token_gap == 0, equivalent to "the emitted block continued by ancestral sampling has the
ancestral law"). On point masses the built-in walk and rejection rules are moreover exactly the
ancestral walk down the tree (exact_law == target_law). Negative controls show the checks catch lossy rules.
"""

from __future__ import annotations

import pytest
import torch
from components import serves_sampling, verifiers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verify_cases import ArgmaxLaw, RandomDraftLaw, RandomLaw, depths, shapes, support_caps, tree_from

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
LOSSLESS = verifiers(lossless=True)
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def domain(name: str) -> dict:
    """The cases a verifier's declarations admit: chains only, and/or T = 0 (one-hot target laws)."""
    return {"chain": VERIFIERS.get(name).chains_only, "greedy": not serves_sampling(name)}


@st.composite
def fixed_cases(draw: st.DrawFn, chain: bool = False, greedy: bool = False):  # type: ignore[no-untyped-def]
    vocab = draw(st.integers(2, 7))
    shape = draw(shapes(chain=chain))
    tokens = [draw(st.integers(0, vocab - 1)) for _ in shape]
    target = (ArgmaxLaw if greedy else RandomLaw)(draw(st.integers(0, 2**32 - 1)), vocab)
    return tree_from(shape, tokens), target


@pytest.mark.parametrize("name", LOSSLESS)
@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_fixed_tree_every_next_token_follows_target(name: str, data: st.DataObject) -> None:
    tree, target = data.draw(fixed_cases(**domain(name)))
    law = exact_law(VERIFIERS.build(name), tree, target)
    assert next_token_gap(law, target) < TOL
    assert abs(sum(law.values()) - 1.0) < TOL


@settings(max_examples=30, **SETTINGS)
@given(case=fixed_cases(), name=st.sampled_from(["sample-walk", "tree-rrs", "tree-rrs-pointmass", "traversal"]))
def test_on_point_masses_the_tree_rules_are_the_ancestral_walk(case, name: str) -> None:
    """With deterministic children these rules accept exactly what sample-walk accepts (their module
    docstrings derive it), so their law is the ancestral walk's, duplicates descending into the first."""
    tree, target = case
    assert law_gap(exact_law(VERIFIERS.build(name), tree, target), target_law(tree, target)) < TOL


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
def sampled_cases(draw: st.DrawFn, chain: bool = False, greedy: bool = False,  # type: ignore[no-untyped-def]
                  max_trees: int = 128):
    vocab = draw(st.integers(2, 7))
    shape = draw(shapes(chain=chain))
    wanted = [draw(st.integers(min(2, vocab), min(3, vocab))) for _ in range(5)]
    caps = support_caps(shape, wanted, max_trees)
    target = (ArgmaxLaw if greedy else RandomLaw)(draw(st.integers(0, 2**32 - 1)), vocab)
    draft = RandomDraftLaw(draw(st.integers(0, 2**32 - 1)), target, lambda depth: caps[depth])
    return shape, target, draft


@pytest.mark.parametrize("name", LOSSLESS)
@settings(max_examples=30, **SETTINGS)
@given(data=st.data(), replacement=st.booleans())
def test_sampled_tree_every_next_token_follows_target(name: str, data: st.DataObject, replacement: bool) -> None:
    shape, target, draft = data.draw(sampled_cases(**domain(name)))
    law = exact_law(VERIFIERS.build(name), lambda rng: sample_tree(0, draft, shape, rng, replacement), target)
    assert next_token_gap(law, target) < TOL
    assert abs(sum(law.values()) - 1.0) < TOL


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


@pytest.mark.parametrize("name", VERIFIERS.names())
@settings(max_examples=10, **SETTINGS)
@given(data=st.data())
def test_next_token_gap_agrees_with_ar_law_comparison(name: str, data: st.DataObject) -> None:
    """The cheap criterion and the literal one (continue every emitted block by ancestral sampling,
    compare with ancestral sampling) agree, for every registered rule, lossless and lossy alike."""
    shape, target, draft = data.draw(sampled_cases(max_trees=12, **domain(name)))
    law = exact_law(VERIFIERS.build(name), lambda rng: sample_tree(0, draft, shape, rng), target)
    length = max(depths(shape)) + 1
    literal = law_gap(extend_law(law, target, length), ar_law(target, length))
    assert (next_token_gap(law, target) < TOL) == (literal < TOL)


@pytest.mark.slow
def test_large_sampled_tree_depth4_twelve_nodes() -> None:
    """One case at the full size (12 nodes, depth 4, two-token draft supports at every node, 2048
    trees) for each lossless rule that reads draft probabilities on trees, both sampling schemes."""
    shape = [-1, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8]
    target = RandomLaw(11, 5)

    def draft(path: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash(path) % 2**31)
        law = torch.zeros(5, dtype=torch.float64)
        law[torch.randperm(5, generator=g)[:2]] = torch.rand(2, generator=g, dtype=torch.float64) + 0.1
        return law

    for name in [n for n in LOSSLESS if VERIFIERS.get(n).needs_draft_probs and not VERIFIERS.get(n).chains_only]:
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
    """Greedy (argmax) drafting that records q as if it had sampled (a recorded row must be the law the
    token was drawn from: docs/methods.md, "Sampled trees and non-anticipation"), and a
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
