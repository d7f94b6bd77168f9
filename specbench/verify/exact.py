"""Exact laws by enumeration: the proof tool for lossless verifiers.

`exact_law(verifier, tree, target_probs)` runs the verifier's reference rule (`verify_probs`) once per
outcome sequence of its random draws, with an `EnumeratingRandomness` that branches on every
`bernoulli`/`categorical` call, and adds up (in float64) the probability of every emitted token
sequence. Each run replays the choices of a prefix and takes the first outcome of every new draw,
recording the alternatives to run later (depth-first); a run's probability is the product of its
choices' probabilities. The verifier code itself is what is enumerated, so the law cannot drift from
it; only the primitives' semantics are assumed (`TorchRandomness` implements the same laws, which the
Monte-Carlo tests check).

Laws are dicts {token tuple: probability}. Target laws are tensors [N, V] (row i = the processed target
law at node i) for a fixed tree, or functions path -> [V] (path = tokens below the anchor) when the
tree is itself sampled, so that rows exist for every tree the sampler can draw.
Comparators: `target_law` (the law of ancestral sampling walked down a fixed tree: what greedy,
sample-walk and RRS with point masses must equal) and `ar_law`/`extend_law` (the law of the first L
tokens when the emitted block is followed by ancestral sampling: equal to `ar_law` iff, for every
prefix, the next emitted token follows the target given that prefix, which is losslessness for any
rule, including rules whose stopping depends on the draft, such as RRS over sampled trees);
`next_token_gap` measures that condition directly.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Callable, Hashable, Iterator, Mapping, Sequence, TypeVar, Union

import torch
from torch import Tensor

from specbench.trees.base import DraftTree
from specbench.verify.base import Randomness, Verifier
from specbench.verify.laws import normalised

Law = dict[tuple[int, ...], float]
TargetFn = Callable[[tuple[int, ...]], Tensor]
TreeSampler = Callable[[Randomness], DraftTree]
T = TypeVar("T")


class EnumerationError(RuntimeError):
    """The enumeration cannot proceed (a draw with no possible outcome, or too many runs)."""


class EnumeratingRandomness(Randomness):
    """Replays `forced` choice indices, then takes the first possible outcome of each new draw and
    records the other possible outcomes as (draw index, choice) branches. `prob` is the product of
    the probabilities of the choices taken."""

    def __init__(self, forced: Sequence[int] = ()) -> None:
        self.forced = list(forced)
        self.choices: list[int] = []
        self.branches: list[tuple[int, int]] = []
        self.prob = 1.0

    def _choose(self, weights: Sequence[float]) -> int:
        k = len(self.choices)
        possible = [i for i, w in enumerate(weights) if w > 0]
        if not possible:
            raise EnumerationError(f"draw {k} has no outcome with positive probability: {list(weights)}")
        if k < len(self.forced):
            choice = self.forced[k]
        else:
            choice = possible[0]
            self.branches.extend((k, c) for c in possible[1:])
        self.choices.append(choice)
        self.prob *= weights[choice]
        return choice

    def bernoulli(self, p: float) -> bool:
        p = min(1.0, max(0.0, float(p)))
        return self._choose([p, 1.0 - p]) == 0

    def categorical(self, probs: Tensor) -> int:
        w = probs.detach().to("cpu", torch.float64)
        total = float(w.sum())
        if not total > 0:
            raise EnumerationError(f"categorical() got weights with sum {total}")
        return self._choose((w / total).tolist())


def enumerate_outcomes(run: Callable[[Randomness], T], max_runs: int = 1_000_000) -> Iterator[tuple[T, float]]:
    """(outcome, probability) of `run(rng)` for every sequence of outcomes of its draws. `run` must be
    deterministic given the outcomes (a fresh state per call)."""
    stack: list[list[int]] = [[]]
    runs = 0
    while stack:
        runs += 1
        if runs > max_runs:
            raise EnumerationError(f"more than {max_runs} runs: shrink the tree, the vocabulary or the supports")
        rng = EnumeratingRandomness(stack.pop())
        outcome = run(rng)
        stack.extend(rng.choices[:k] + [c] for k, c in rng.branches)
        yield outcome, rng.prob


def enumerate_law(run: Callable[[Randomness], Hashable], max_runs: int = 1_000_000) -> dict[Hashable, float]:
    """{outcome: probability} of `run(rng)` (see `enumerate_outcomes`)."""
    law: dict[Hashable, float] = defaultdict(float)
    for outcome, prob in enumerate_outcomes(run, max_runs):
        law[outcome] += prob
    return dict(law)


def node_paths(tree: DraftTree) -> list[tuple[int, ...]]:
    """paths[i] = tokens from the root's child down to node i (() for the root)."""
    tokens, parents, _ = tree.host
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, len(tokens)):
        paths.append(paths[parents[i]] + (tokens[i],))
    return paths


def target_rows(tree: DraftTree, target_probs: Union[Tensor, TargetFn]) -> Tensor:
    """[N, V] float64 laws: the given rows, or target_probs(path) for every node."""
    if callable(target_probs):
        return normalised(torch.stack([target_probs(p) for p in node_paths(tree)]))
    if target_probs.shape[0] != tree.num_nodes:
        raise ValueError(f"target_probs has {target_probs.shape[0]} rows for a tree of {tree.num_nodes} nodes")
    return normalised(target_probs)


def exact_law(
    verifier: Verifier,
    tree: Union[DraftTree, TreeSampler],
    target_probs: Union[Tensor, TargetFn],
    draft_probs: Tensor | None = None,
    max_runs: int = 1_000_000,
) -> Law:
    """The exact law (float64) of the tokens `verifier` emits (accepted drafts + bonus).

    tree: a fixed DraftTree, or a sampler rng -> DraftTree whose draws are enumerated too (the law is
    then averaged over the drafts, as rejection-sampling rules require). target_probs: [N, V] rows
    for a fixed tree, or a function path -> [V]. draft_probs [N, V] replaces tree.draft_probs.
    """
    if not isinstance(tree, DraftTree):
        if draft_probs is not None:
            raise ValueError("draft_probs cannot override the rows of a sampled tree")
        return _sampled_tree_law(verifier, tree, target_probs, max_runs)
    fixed = tree if draft_probs is None else replace(tree, draft_probs=draft_probs)
    rows = target_rows(fixed, target_probs)

    def run(rng: Randomness) -> tuple[int, ...]:
        return tuple(verifier.verify_probs(fixed, rows, rng).tokens)

    return enumerate_law(run, max_runs)  # type: ignore[return-value]


def _sampled_tree_law(verifier: Verifier, sampler: TreeSampler, target: Union[Tensor, TargetFn], max_runs: int) -> Law:
    """All draft draws precede the verifier's: enumerate the trees, then the verifier on each."""
    if not callable(target):
        raise ValueError("a sampled tree needs target_probs as a function path -> law [V]")
    memo: dict[tuple[int, ...], Tensor] = {}

    def cached(path: tuple[int, ...]) -> Tensor:
        if path not in memo:
            memo[path] = target(path)
        return memo[path]

    law: Law = defaultdict(float)
    for drawn, p_tree in enumerate_outcomes(sampler, max_runs):
        for seq, p in exact_law(verifier, drawn, target_rows(drawn, cached), max_runs=max_runs).items():
            law[seq] += p_tree * p
    return dict(law)


def target_law(tree: DraftTree, target_probs: Union[Tensor, TargetFn]) -> Law:
    """The law of ancestral sampling from the target walked down `tree`: sample y ~ p at the current
    node, descend into the first child with token y, stop (emitting y) when there is none."""
    tokens, _, _ = tree.host
    children = tree.children
    rows = target_rows(tree, target_probs).tolist()
    law: Law = defaultdict(float)

    def visit(node: int, prefix: tuple[int, ...], mass: float) -> None:
        first: dict[int, int] = {}
        for c in children[node]:
            first.setdefault(tokens[c], c)
        for y, p in enumerate(rows[node]):
            if p > 0:
                if y in first:
                    visit(first[y], prefix + (y,), mass * p)
                else:
                    law[prefix + (y,)] += mass * p

    visit(0, (), 1.0)
    return dict(law)


def extend_law(law: Mapping[tuple[int, ...], float], target: TargetFn, length: int) -> Law:
    """The law of the first `length` tokens when each emitted sequence is continued by ancestral
    sampling from `target` (longer sequences are truncated)."""
    out: Law = defaultdict(float)
    rows: dict[tuple[int, ...], list[float]] = {}

    def grow(prefix: tuple[int, ...], mass: float) -> None:
        if len(prefix) >= length:
            out[prefix[:length]] += mass
            return
        if prefix not in rows:
            rows[prefix] = normalised(target(prefix)).tolist()
        for y, p in enumerate(rows[prefix]):
            if p > 0:
                grow(prefix + (y,), mass * p)

    for seq, mass in law.items():
        grow(seq, mass)
    return dict(out)


def ar_law(target: TargetFn, length: int) -> Law:
    """The law of the first `length` tokens of ancestral sampling from `target`."""
    return extend_law({(): 1.0}, target, length)


def next_token_gap(law: Mapping[tuple[int, ...], float], target: TargetFn) -> float:
    """max over prefixes v the law continues past, and tokens y, of |P(S starts with v+y) - M(v) p(y|v)|
    where M(v) = P(S starts with v and is longer). Zero iff every emitted next token follows the
    target given its prefix, i.e. iff `extend_law(law, target, L) == ar_law(target, L)` for L >= the
    longest emitted sequence; cheaper, since it visits only prefixes the law reaches."""
    starts: dict[tuple[int, ...], float] = defaultdict(float)  # mass of S starting with a prefix
    for seq, mass in law.items():
        for k in range(1, len(seq) + 1):
            starts[seq[:k]] += mass
    longer: dict[tuple[int, ...], float] = defaultdict(float)
    for prefix, mass in starts.items():
        longer[prefix[:-1]] += mass
    gap = 0.0
    for prefix, m in longer.items():
        p = normalised(target(prefix)).tolist()
        gap = max(gap, max(abs(starts.get(prefix + (y,), 0.0) - m * p[y]) for y in range(len(p))))
    return gap


def law_gap(a: Mapping[tuple[int, ...], float], b: Mapping[tuple[int, ...], float]) -> float:
    """max over sequences of |a - b| (0.0 for two empty laws)."""
    return max((abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b)), default=0.0)
