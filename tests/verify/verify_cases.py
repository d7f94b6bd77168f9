"""Random target/draft laws over tiny vocabularies and random tree shapes, for the verifier tests.

Laws are functions of the token path below the anchor (the target is a language model: duplicate
nodes share their row), drawn lazily from a seed so that sampled trees can reach any path. Each row
is one of several kinds so that edge cases are common: dense, sparse (zeros), one-hot, exact ties,
near-ties (1 ulp apart), dyadic weights; a draft row may also equal the target row or differ from
it by 1e-13.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from hypothesis import strategies as st
from torch import Tensor

from specbench.trees.base import DraftTree

KINDS = ("dense", "sparse", "onehot", "ties", "near-ties", "dyadic")


def random_weights(rng: np.random.Generator, support: np.ndarray, vocab: int, kind: str) -> np.ndarray:
    """A law [vocab] (float64, sums to 1) supported on a subset of `support` (all of it unless sparse)."""
    w = np.zeros(vocab)
    k = support.size
    if kind == "onehot" or k == 1:
        w[rng.choice(support)] = 1.0
    elif kind == "ties":
        tied = rng.choice(support, size=int(rng.integers(2, k + 1)), replace=False)
        w[tied] = 1.0
        rest = np.setdiff1d(support, tied)
        w[rest] = rng.integers(0, 2, size=rest.size) * 0.5  # more exact ties, or zeros
    elif kind == "dyadic":
        w[support] = rng.integers(0, 5, size=k)
        if w.sum() == 0:
            w[support[0]] = 1.0
    else:
        w[support] = rng.dirichlet(np.full(k, float(rng.choice([0.3, 1.0, 3.0]))))
        if kind == "sparse":
            w[rng.choice(support, size=int(rng.integers(1, k)), replace=False)] = 0.0
            if w.sum() == 0:
                w[support[0]] = 1.0
        elif kind == "near-ties":
            top = np.argsort(-w, kind="stable")[:2]
            w[top[1]] = np.nextafter(w[top[0]], 0.0)  # one ulp below the maximum
    return w / w.sum()


class RandomLaw:
    """path -> law [V] float64; memoised; reproducible from (seed, vocab)."""

    def __init__(self, seed: int, vocab: int, salt: int = 0) -> None:
        self.seed, self.vocab, self.salt = seed, vocab, salt
        self.memo: dict[tuple[int, ...], Tensor] = {}

    def rng(self, path: tuple[int, ...]) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.salt, len(path), *path])

    def row(self, path: tuple[int, ...]) -> np.ndarray:
        rng = self.rng(path)
        return random_weights(rng, np.arange(self.vocab), self.vocab, str(rng.choice(KINDS)))

    def __call__(self, path: tuple[int, ...]) -> Tensor:
        if path not in self.memo:
            self.memo[path] = torch.from_numpy(self.row(tuple(path)))
        return self.memo[path]


class ArgmaxLaw(RandomLaw):
    """The T = 0 processed law of a RandomLaw: one-hot on its argmax (lowest id among exact ties)."""

    def row(self, path: tuple[int, ...]) -> np.ndarray:
        w = np.zeros(self.vocab)
        w[int(np.argmax(super().row(path)))] = 1.0  # np.argmax returns the first maximum
        return w


class RandomDraftLaw(RandomLaw):
    """A draft law with at most `cap(depth)` tokens in its support (bounding the trees a sampler can
    draw); sometimes equal to the target's row, or 1e-13 away from it."""

    def __init__(self, seed: int, target: RandomLaw, cap: Callable[[int], int]) -> None:
        super().__init__(seed, target.vocab, salt=1)
        self.target, self.cap = target, cap

    def row(self, path: tuple[int, ...]) -> np.ndarray:
        rng = self.rng(path)
        cap = self.cap(len(path))
        p = self.target(path).numpy()
        mode = rng.choice(["kind", "equal", "near"])
        if mode != "kind" and np.count_nonzero(p) <= cap:
            if mode == "equal":
                return p.copy()
            w = p + 1e-13 * rng.random(p.size) * (p > 0)
            return w / w.sum()
        support = rng.choice(self.vocab, size=cap, replace=False)
        kind = str(rng.choice(KINDS, p=[0.5, 0.1, 0.1, 0.1, 0.1, 0.1]))
        return random_weights(rng, support, self.vocab, kind)


@st.composite
def shapes(draw: st.DrawFn, max_nodes: int = 12, max_depth: int = 4, chain: bool = False) -> list[int]:
    """A parents list (shape[0] = -1) of at most max_nodes nodes and depth <= max_depth."""
    if chain:
        return list(range(-1, draw(st.integers(1, max_depth + 1)) - 1))
    n = draw(st.integers(2, max_nodes))
    parents, depth = [-1], [0]
    for i in range(1, n):
        parent = draw(st.sampled_from([j for j in range(i) if depth[j] < max_depth]))
        parents.append(parent)
        depth.append(depth[parent] + 1)
    return parents


def depths(shape: list[int]) -> list[int]:
    out = [0]
    for p in shape[1:]:
        out.append(out[p] + 1)
    return out


def tree_from(shape: list[int], tokens: list[int]) -> DraftTree:
    as_t = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return DraftTree(tokens=as_t(tokens), parents=as_t(shape), depth=as_t(depths(shape)))


def support_caps(shape: list[int], wanted: list[int], max_trees: int) -> list[int]:
    """Per-depth support caps (from `wanted`), lowered deepest-first until the number of trees a
    with-replacement sampler can draw, prod over nodes of cap[depth(parent)], is <= max_trees."""
    d = depths(shape)
    caps = list(wanted)

    def bound() -> int:
        return int(np.prod([caps[d[p]] for p in shape[1:]])) if len(shape) > 1 else 1

    while bound() > max_trees:
        level = max(i for i, c in enumerate(caps) if c > 1)
        caps[level] -= 1
    return caps


def chi_square_pvalue(counts: dict, law: dict, n: int, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit of `counts` (n draws) to `law`; cells expected below
    `min_expected` are pooled into one. An outcome outside the law's support gives p = 0."""
    if any(k not in law or law[k] <= 0 for k in counts):
        return 0.0
    cells, pooled_e, pooled_o = [], 0.0, 0
    for k, p in law.items():
        e, o = n * p, counts.get(k, 0)
        if e < min_expected:
            pooled_e, pooled_o = pooled_e + e, pooled_o + o
        else:
            cells.append((o, e))
    if pooled_e > 0:
        cells.append((pooled_o, pooled_e))
    if len(cells) < 2:
        return 1.0
    stat = sum((o - e) ** 2 / e for o, e in cells)
    dof = torch.tensor((len(cells) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, torch.tensor(stat / 2, dtype=torch.float64)))
