"""Verifier interface, its result, and the one randomness interface every verifier draws through.

All randomness a verifier uses goes through `Randomness` primitives, so tests can replace the
generator with an enumerator of every outcome and compute the exact law of what the verifier emits.
Pure: never imports models or the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from specbench.config import SamplingConfig
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


class Randomness(ABC):
    """The random primitives verifiers (and samplers) may use."""

    @abstractmethod
    def bernoulli(self, p: float) -> bool:
        """True with probability p (p is clipped to [0, 1])."""

    @abstractmethod
    def categorical(self, probs: Tensor) -> int:
        """An index drawn from probs [V] (non-negative, summing to 1)."""


class TorchRandomness(Randomness):
    """Randomness from a seeded torch.Generator on the CPU (reproducible across devices)."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(int(seed))

    def bernoulli(self, p: float) -> bool:
        u = torch.rand((), generator=self.generator, dtype=torch.float64).item()
        return u < float(p)

    def categorical(self, probs: Tensor) -> int:
        p = probs.detach().to("cpu", torch.float64)
        return int(torch.multinomial(p, 1, generator=self.generator).item())


class Verifier(ABC):
    """Decides which draft nodes the target accepts, and the bonus token.

    lossless: the emitted tokens follow the processed target law exactly (proven by exact tests).
    needs_draft_probs: the rule reads `tree.draft_probs` (rejection sampling); None rows mean point mass.
    """

    lossless: ClassVar[bool] = True
    needs_draft_probs: ClassVar[bool] = False

    def check(self, sampling: SamplingConfig) -> None:
        """Raise ValueError if this verifier cannot serve `sampling` (called before a request starts)."""

    def verify(self, tree: DraftTree, target_logits: Tensor, sampling: SamplingConfig, rng: Randomness) -> VerifyResult:
        """target_logits [N, V]: the target's logits at every tree node (row i predicts i's child)."""
        return self.verify_probs(tree, process_logits(target_logits, sampling), rng)

    @abstractmethod
    def verify_probs(self, tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
        """target_probs [N, V]: the processed target law at every node."""
