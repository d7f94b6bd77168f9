"""Verifier interface, its result, and the one randomness interface every verifier draws through.

All randomness a verifier uses goes through `Randomness` primitives, so tests can replace the
generator with an enumerator of every outcome and compute the exact law of what the verifier emits.

Every primitive is defined by uniforms: `bernoulli(p)` is `u < p` and `categorical(w)` is the inverse
CDF of `w` at `u` (`inverse_cdf`), one uniform each. Vectorised verifiers pre-draw one uniform per
node with `uniform(n)` and apply the same two rules to whole tensors, so replaying those uniforms
through the scalar primitives (`ReplayRandomness`) reproduces the reference implementation exactly.
Pure: never imports models or the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch
from torch import Tensor

from specbench.config import SamplingConfig
from specbench.registry import require_declared
from specbench.trees.base import DraftTree
from specbench.verify.sampling import process_logits


@dataclass
class VerifyResult:
    """path: accepted node ids from the root (root included, so len(path) = accepted drafts + 1).
    tokens: accepted draft tokens followed by the bonus/correction token (len(tokens) = len(path))."""

    path: list[int]
    tokens: list[int]

    @property
    def accepted_drafts(self) -> int:
        return len(self.path) - 1


@dataclass
class Acceptance:
    """A verify result as one device tensor, written without a host read (what the GPU round commits
    from and reads once per round).

    packed [2 + N] int64: [P, bonus, path[0..P), -1, ...] (the `tree_accept` layout; P = accepted
    drafts + 1, path = accepted node ids from the root). Views: count [1], bonus [1], path [N].
    """

    packed: Tensor

    @property
    def count(self) -> Tensor:
        return self.packed[0:1]

    @property
    def bonus(self) -> Tensor:
        return self.packed[1:2]

    @property
    def path(self) -> Tensor:
        return self.packed[2:]

    @classmethod
    def from_result(cls, result: VerifyResult, num_nodes: int, device: torch.device | str) -> "Acceptance":
        """The packed form of a host result (one small host->device copy)."""
        row = [len(result.path), result.tokens[-1], *result.path] + [-1] * (num_nodes - len(result.path))
        return cls(torch.tensor(row, dtype=torch.long).to(device))


def read_acceptance(packed_and_tokens: Sequence[int], num_nodes: int) -> VerifyResult:
    """The host result from a read of cat([Acceptance.packed, tree.tokens]) (length 2 + 2N)."""
    count = packed_and_tokens[0]
    path = list(packed_and_tokens[2: 2 + count])
    tokens = [packed_and_tokens[2 + num_nodes + i] for i in path[1:]] + [packed_and_tokens[1]]
    return VerifyResult(path=path, tokens=tokens)


def inverse_cdf(weights: Tensor, u: Tensor) -> Tensor:
    """weights [..., V] (non-negative, not necessarily normalised), u [...] in [0, 1) -> index [...].

    Index i is returned for u in [cdf[i-1], cdf[i]) / cdf[-1], computed in float64, so a zero weight
    is never chosen. Used both by scalar draws and by vectorised verifiers (same ops, same result).
    """
    w = weights.to(torch.float64)
    cdf = torch.cumsum(w, dim=-1)  # [..., V]
    x = (u.to(device=w.device, dtype=torch.float64) * cdf[..., -1]).unsqueeze(-1)  # [..., 1]
    idx = torch.searchsorted(cdf, x, right=True).squeeze(-1)  # [...]: first i with cdf[i] > x
    # u * total can round up to total: then take the last token with positive weight.
    positive = torch.arange(1, w.shape[-1] + 1, device=w.device) * (w > 0)
    last_positive = positive.max(dim=-1).values - 1  # [...]
    return torch.where(idx >= w.shape[-1], last_positive, idx)


class Randomness(ABC):
    """The random primitives verifiers (and samplers) may use."""

    #: True when `uniform(n)` is available (vectorised verifiers need it; enumerators cannot give it).
    draws_uniforms: ClassVar[bool] = False

    @abstractmethod
    def bernoulli(self, p: float) -> bool:
        """True with probability p (p is clipped to [0, 1])."""

    @abstractmethod
    def categorical(self, probs: Tensor) -> int:
        """An index drawn from probs [V] (non-negative; normalised by its sum)."""

    def uniform(self, n: int) -> Tensor:
        """n independent U[0, 1) draws [n] float64 on the CPU (pre-drawn per node by vectorised verifiers)."""
        raise NotImplementedError(
            f"{type(self).__name__} draws discrete outcomes only; vectorised verifiers fall back to their "
            f"reference implementation with it")


class UniformRandomness(Randomness):
    """Scalar primitives defined by one uniform each (the definition vectorised verifiers share)."""

    draws_uniforms = True

    @abstractmethod
    def uniform(self, n: int) -> Tensor: ...

    def bernoulli(self, p: float) -> bool:
        return bool(self.uniform(1)[0] < float(p))

    def categorical(self, probs: Tensor) -> int:
        return int(inverse_cdf(probs.detach().cpu(), self.uniform(1)[0]))


class TorchRandomness(UniformRandomness):
    """Randomness from a seeded torch.Generator on the CPU (reproducible across devices)."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(int(seed))

    def uniform(self, n: int) -> Tensor:
        return torch.rand(n, generator=self.generator, dtype=torch.float64)


class ReplayRandomness(UniformRandomness):
    """Hands out a given sequence of uniforms, in order; used to run a reference verifier on exactly
    the uniforms a vectorised one drew. `remaining` says how many were not consumed."""

    def __init__(self, uniforms: Sequence[float] | Tensor) -> None:
        self.values = torch.as_tensor(uniforms, dtype=torch.float64).flatten().cpu()
        self.used = 0

    @property
    def remaining(self) -> int:
        return self.values.numel() - self.used

    def uniform(self, n: int) -> Tensor:
        if n > self.remaining:
            raise RuntimeError(f"replay asked for {n} uniforms with {self.remaining} left")
        out = self.values[self.used:self.used + n]
        self.used += n
        return out


class Verifier(ABC):
    """Decides which draft nodes the target accepts, and the bonus token. Built as `Verifier(**verifier_args)`;
    every argument has a default (the exact tests build each registered verifier with none).

    lossless (declared by every verifier, no default): the emitted tokens follow the processed target
    law exactly. True puts the verifier under the exact-enumeration proofs of tests/verify; False
    makes the engine refuse it unless `allow_lossy`.
    needs_draft_probs: the rule reads `tree.draft_probs` (rejection sampling); None means point mass.
    chains_only: the rule verifies a single chain (the proofs then draw chains only).
    A verifier that serves only T = 0 says so in `check` (the proofs then use one-hot target laws).
    `verify_probs` is the reference rule drawing through the scalar primitives (what `exact_law`
    enumerates); a verifier may override `verify` with a vectorised implementation of the same rule.
    With a root-only tree a sampling rule draws the bonus with one `rng.categorical(p_root)`, so
    rounds without drafts reproduce plain AR sampling from the same seed.
    """

    lossless: ClassVar[bool]
    needs_draft_probs: ClassVar[bool] = False
    chains_only: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        require_declared(cls, Verifier, {"lossless": "`lossless = True` (its law is the target's; the exact tests "
                                                     "prove it) or `lossless = False` (refused unless allow_lossy)"})
        if "lossless" in dir(cls) and not isinstance(cls.lossless, bool):
            raise TypeError(f"{cls.__qualname__}.lossless must be True or False, got {cls.lossless!r}")

    def check(self, sampling: SamplingConfig) -> None:
        """Raise ValueError if this verifier cannot serve `sampling` (called before a request starts)."""

    def verify(self, tree: DraftTree, target_logits: Tensor, sampling: SamplingConfig, rng: Randomness) -> VerifyResult:
        """target_logits [N, V]: the target's logits at every tree node (row i predicts i's child)."""
        return self.verify_probs(tree, process_logits(target_logits, sampling), rng)

    def accepts_on_device(self, sampling: SamplingConfig) -> bool:
        """True when `accept` serves `sampling` (default: never)."""
        return False

    def accept(self, tree: DraftTree, target_logits: Tensor, sampling: SamplingConfig) -> Acceptance:
        """The same decision as `verify`, as device tensors and without reading the device (so the GPU
        round can capture it in a CUDA graph). Only where `accepts_on_device(sampling)`: a rule that
        draws through the host's `Randomness` has no such form."""
        raise NotImplementedError(f"{type(self).__name__} decides on the host: call verify()")

    @abstractmethod
    def verify_probs(self, tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
        """target_probs [N, V]: the processed target law at every node."""
