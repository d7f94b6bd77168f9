"""`argmax-match`: a lossy rule, kept to show what the exact tests and the engine's refusal catch.

It is the fallback SSD's engine uses on a speculation-cache miss at T > 0 (docs/methods.md,
"Verifiers"): accept a draft child while its token is the target's argmax, then sample the bonus from the full p at the stop.
When the draft proposes the argmax a, the first emitted token is a with probability 1 instead of p(a)
(and with probability p(a) more when it does not), so at T > 0 the law is not the target's.
lossless = False: the engine refuses it unless SpecConfig.allow_lossy is set.
"""

from __future__ import annotations

from torch import Tensor

from specbench.trees.base import DraftTree
from specbench.verify import VERIFIERS
from specbench.verify.base import Randomness, Verifier, VerifyResult


@VERIFIERS.register("argmax-match")
class ArgmaxMatch(Verifier):
    """Descend while the child is the target's argmax; bonus y ~ p at the stop (lossy at T > 0)."""

    lossless = False

    def verify_probs(self, tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
        argmax = target_probs.argmax(dim=-1).tolist()
        tokens, _, _ = tree.host
        children = tree.children
        node, path = 0, [0]
        while True:
            nxt = next((c for c in children[node] if tokens[c] == argmax[node]), None)
            if nxt is None:
                bonus = rng.categorical(target_probs[node])
                return VerifyResult(path=path, tokens=[tokens[i] for i in path[1:]] + [bonus])
            node = nxt
            path.append(node)
