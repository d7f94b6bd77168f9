"""Monte-Carlo: what `Verifier.verify` actually emits with TorchRandomness (the engine's path,
vectorised where available; sampled trees drawn with their own TorchRandomness) follows `exact_law`.
Seeded, so deterministic; chi-square per case with a Bonferroni correction over all cases."""

from __future__ import annotations

from collections import Counter

from verify_cases import RandomDraftLaw, RandomLaw, chi_square_pvalue, tree_from

from specbench.config import SamplingConfig
from specbench.verify import VERIFIERS, TorchRandomness, exact_law, sample_tree
from specbench.verify.exact import target_rows

DRAWS = 1200
FAMILY_ALPHA = 1e-3
SHAPE = [-1, 0, 0, 0, 1, 1, 2, 4]
CHAIN = [-1, 0, 1, 2]


def mc_pvalue(name: str, case: int, seed: int) -> float:
    verifier = VERIFIERS.build(name)
    sampling = SamplingConfig(temperature=1.0)
    target = RandomLaw(100 + case, 4 + case % 2)
    if case == 0:  # a fixed point-mass tree with duplicate siblings (a chain for chain-rs)
        tree = tree_from(CHAIN, [0, 1, 1, 2]) if name == "chain-rs" else tree_from(SHAPE, [0, 1, 1, 2, 0, 0, 3, 1])
        law = exact_law(verifier, tree, target)
        logits = target_rows(tree, target).log()
        sample = lambda rng, draft_rng: verifier.verify(tree, logits, sampling, rng)  # noqa: E731
    else:  # trees sampled with (case 1) or without (case 2) replacement
        draft = RandomDraftLaw(200 + case, target, lambda depth: 2)
        shape = CHAIN if name == "chain-rs" else SHAPE
        draw = lambda rng: sample_tree(0, draft, shape, rng, replacement=case == 1)  # noqa: E731
        law = exact_law(verifier, draw, target)

        def sample(rng, draft_rng):  # type: ignore[no-untyped-def]
            tree = draw(draft_rng)
            return verifier.verify(tree, target_rows(tree, target).log(), sampling, rng)
    rng, draft_rng = TorchRandomness(seed), TorchRandomness(1000 + seed)  # independent across cases
    counts = Counter(tuple(sample(rng, draft_rng).tokens) for _ in range(DRAWS))
    return chi_square_pvalue(counts, law, DRAWS)


def test_verify_follows_exact_law() -> None:
    cases = [("sample-walk", 0), ("tree-rrs-pointmass", 0), ("tree-rrs-pointmass", 1), ("tree-rrs", 0),
             ("tree-rrs", 1), ("tree-rrs", 2), ("traversal", 1), ("traversal", 2), ("chain-rs", 0), ("chain-rs", 1),
             ("argmax-match", 1)]
    pvalues = {c: mc_pvalue(*c, seed=i) for i, c in enumerate(cases)}
    worst = min(pvalues, key=pvalues.get)
    assert pvalues[worst] > FAMILY_ALPHA / len(cases), f"{worst}: p = {pvalues[worst]:.2e} ({pvalues})"


def test_the_check_has_power() -> None:
    """A law 4% off in two outcomes is rejected by the same test at the same sample size."""
    target = RandomLaw(7, 4)
    tree = tree_from(SHAPE, [0, 1, 1, 2, 0, 0, 3, 1])
    law = exact_law(VERIFIERS.build("sample-walk"), tree, target)
    first, second = sorted(law, key=law.get, reverse=True)[:2]
    tilted = dict(law)
    tilted[first] -= 0.04  # move 4% of the mass between the two likeliest outcomes
    tilted[second] += 0.04
    verifier, logits = VERIFIERS.build("sample-walk"), target_rows(tree, target).log()
    rng = TorchRandomness(3)
    counts = Counter(tuple(verifier.verify(tree, logits, SamplingConfig(1.0), rng).tokens) for _ in range(DRAWS))
    assert chi_square_pvalue(counts, law, DRAWS) > 1e-3
    assert chi_square_pvalue(counts, tilted, DRAWS) < 1e-4


def test_greedy_verify_is_its_exact_law() -> None:
    target = RandomLaw(5, 6)
    tree = tree_from(SHAPE, [0, 1, 1, 2, 0, 0, 3, 1])
    probs = target_rows(tree, target)  # used as logits: the same argmax, near-ties included
    law = exact_law(VERIFIERS.build("greedy"), tree, probs)
    got = VERIFIERS.build("greedy").verify(tree, probs, SamplingConfig(0.0), TorchRandomness(0))
    assert law == {tuple(got.tokens): 1.0}
