"""Tree walks: `greedy` (argmax at T = 0) and `sample-walk` (one target sample per visited node).

sample-walk is lossless for any tree fixed before verification: every emitted token is the target's
own sample at the node where it is emitted, and the tree does not depend on those samples. With
duplicate sibling tokens the walk descends into the first of them (in node order).
Both run vectorised by default (`specbench.verify.vectorised`); `verify_probs` is the reference walk
that `exact_law` enumerates.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from specbench.config import SamplingConfig
from specbench.trees.base import DraftTree
from specbench.verify import VERIFIERS
from specbench.verify.base import Acceptance, Randomness, Verifier, VerifyResult
from specbench.verify.sampling import process_logits
from specbench.verify.vectorised import accept_packed, greedy_batched, sample_walk_batched


def walk(tree: DraftTree, pick: Callable[[int], int]) -> VerifyResult:
    """From the root, descend into the first child whose token is pick(node); stop with pick(node)."""
    tokens, _, _ = tree.host
    children = tree.children
    node, path, out = 0, [0], []
    while True:
        y = pick(node)
        out.append(y)
        nxt = next((c for c in children[node] if tokens[c] == y), None)
        if nxt is None:
            return VerifyResult(path=path, tokens=out)
        node = nxt
        path.append(node)


@VERIFIERS.register("greedy")
class GreedyWalk(Verifier):
    """Descend while the draft child equals the target's argmax; the argmax at the stop is the bonus."""

    lossless = True

    def __init__(self, vectorised: bool = True) -> None:
        self.vectorised = vectorised

    def check(self, sampling: SamplingConfig) -> None:
        if not sampling.greedy:
            raise ValueError("the 'greedy' verifier needs temperature 0; use 'sample-walk' (or another lossless sampler) for T > 0")

    def verify(self, tree: DraftTree, target_logits: Tensor, sampling: SamplingConfig, rng: Randomness) -> VerifyResult:
        self.check(sampling)
        if self.vectorised:
            return greedy_batched(tree, target_logits)
        return self.verify_probs(tree, target_logits, rng)

    def accepts_on_device(self, sampling: SamplingConfig) -> bool:
        return sampling.greedy

    def accept(self, tree: DraftTree, target_logits: Tensor, sampling: SamplingConfig) -> Acceptance:
        self.check(sampling)
        return Acceptance(accept_packed(tree, target_logits.argmax(dim=-1)))

    def verify_probs(self, tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
        argmax = target_probs.argmax(dim=-1).tolist()  # one host read for all nodes
        return walk(tree, lambda node: argmax[node])


@VERIFIERS.register("sample-walk")
class SampleWalk(Verifier):
    """Sample y ~ p at each visited node; descend into the child whose token is y, else stop with y."""

    lossless = True

    def __init__(self, vectorised: bool = True) -> None:
        self.vectorised = vectorised

    def verify(self, tree: DraftTree, target_logits: Tensor, sampling: SamplingConfig, rng: Randomness) -> VerifyResult:
        probs = process_logits(target_logits, sampling)
        if self.vectorised and rng.draws_uniforms:
            return sample_walk_batched(tree, probs, rng.uniform(tree.num_nodes))
        return self.verify_probs(tree, probs, rng)

    def verify_probs(self, tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
        return walk(tree, lambda node: rng.categorical(target_probs[node]))
