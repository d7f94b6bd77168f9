"""Verifiers (lossless rules proven by exact enumeration) and sampling transforms.

Pure package: tensors in, tensors out. Imports torch, trees/ (DraftTree), config (SamplingConfig),
the registry and kernels/ (the GPU accept kernel); never models/, drafters/ or the engine.

Contract (`verify.base.Verifier`): `verify(tree, target_logits [N, V], sampling, rng)` returns the
accepted path (root first) and the emitted tokens (accepted drafts, then the bonus); every random
draw goes through `rng`, and `verify_probs` is the reference rule on processed laws that `exact_law`
enumerates. Every verifier declares `lossless` (no default): each registered lossless verifier is
proven by the exact tests (tests/verify), a lossy one is refused by the engine unless allow_lossy.

Registered verifiers (lossless unless noted):
  greedy              argmax walk (T = 0)
  sample-walk         one target sample per visited node; any tree fixed before verification
  chain-rs            Leviathan/Chen speculative sampling on a chain (point mass when draft_probs is None)
  tree-rrs            recursive rejection sampling over sampled trees (with or without replacement)
  tree-rrs-pointmass  the EAGLE-2/3 rule for deterministic children
  traversal           traversal verification (leaf-to-root, sequence-level; block verification on chains)
  argmax-match        LOSSY (SSD's cache-miss fallback); refused unless allow_lossy
`exact_law` computes the exact law of what a verifier emits; see `specbench.verify.exact`. What
`DraftTree.draft_probs` rows mean: `specbench.verify.draft_sampling`.
"""

from specbench.registry import Registry

VERIFIERS: Registry = Registry("verifier", base="specbench.verify.base:Verifier")
VERIFIERS.register("greedy", "specbench.verify.walk:GreedyWalk")
VERIFIERS.register("sample-walk", "specbench.verify.walk:SampleWalk")
VERIFIERS.register("chain-rs", "specbench.verify.rejection:ChainRS")
VERIFIERS.register("tree-rrs", "specbench.verify.rejection:TreeRRS")
VERIFIERS.register("tree-rrs-pointmass", "specbench.verify.rejection:TreeRRSPointMass")
VERIFIERS.register("traversal", "specbench.verify.traversal:Traversal")
VERIFIERS.register("argmax-match", "specbench.verify.lossy:ArgmaxMatch")

from specbench.verify.base import (  # noqa: E402
    Randomness,
    ReplayRandomness,
    TorchRandomness,
    Verifier,
    VerifyResult,
    inverse_cdf,
)
from specbench.verify.draft_sampling import sample_tree  # noqa: E402
from specbench.verify.exact import (  # noqa: E402
    EnumeratingRandomness,
    ar_law,
    enumerate_law,
    exact_law,
    extend_law,
    law_gap,
    next_token_gap,
    target_law,
)
from specbench.verify.sampling import process_logits  # noqa: E402

__all__ = [
    "VERIFIERS", "EnumeratingRandomness", "Randomness", "ReplayRandomness", "TorchRandomness", "Verifier",
    "VerifyResult", "ar_law", "enumerate_law", "exact_law", "extend_law", "inverse_cdf", "law_gap", "next_token_gap",
    "process_logits", "sample_tree", "target_law",
]
