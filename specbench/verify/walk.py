"""Tree walks: `greedy` (argmax at T = 0) and `sample-walk` (one target sample per visited node).

sample-walk is lossless for any tree fixed before verification: every emitted token is the target's
own sample at the node where it is emitted, and the tree does not depend on those samples.
"""

from __future__ import annotations

from torch import Tensor

from specbench.config import SamplingConfig
from specbench.trees.base import DraftTree
from specbench.verify import VERIFIERS
from specbench.verify.base import Randomness, Verifier, VerifyResult


def _walk(tree: DraftTree, pick) -> VerifyResult:  # type: ignore[no-untyped-def]
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

    def check(self, sampling: SamplingConfig) -> None:
        if not sampling.greedy:
            raise ValueError("the 'greedy' verifier needs temperature 0; use 'sample-walk' (or another lossless sampler) for T > 0")

    def verify(self, tree: DraftTree, target_logits: Tensor, sampling: SamplingConfig, rng: Randomness) -> VerifyResult:
        self.check(sampling)
        argmax = target_logits.argmax(dim=-1).tolist()  # one host read for all nodes
        return _walk(tree, lambda node: argmax[node])

    def verify_probs(self, tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
        argmax = target_probs.argmax(dim=-1).tolist()
        return _walk(tree, lambda node: argmax[node])


@VERIFIERS.register("sample-walk")
class SampleWalk(Verifier):
    """Sample y ~ p at each visited node; descend into the child whose token is y, else stop with y."""

    lossless = True

    def verify_probs(self, tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
        return _walk(tree, lambda node: rng.categorical(target_probs[node]))
