"""Verifiers (lossless rules proven by exact enumeration) and sampling transforms. Pure package."""

from specbench.registry import Registry

VERIFIERS: Registry = Registry("verifier")
VERIFIERS.register("greedy", "specbench.verify.walk:GreedyWalk")
VERIFIERS.register("sample-walk", "specbench.verify.walk:SampleWalk")

from specbench.verify.base import Randomness, TorchRandomness, Verifier, VerifyResult  # noqa: E402
from specbench.verify.sampling import process_logits  # noqa: E402

__all__ = ["VERIFIERS", "Randomness", "TorchRandomness", "Verifier", "VerifyResult", "process_logits"]
