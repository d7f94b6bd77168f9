"""`traversal`: traversal verification (Weng et al., arXiv 2505.12398), sequence-level acceptance
decided from the leaves towards the root. On a chain it is block verification (Sun et al. 2024).

Derivation (ours; the exact tests check it). Give every node u a weight a_u in [0, 1] (root: 1) and
process it depth-first, children in node order (= draw order), with a sub-probability G over tokens:
    G = a_u * p_u
    for each child c with token x and row r (the law x was drawn from, given earlier siblings):
        a_c = min(1, G(x) / r(x));  if process(c, a_c) accepts: return that acceptance
        G = max(0, G - r) / rho,    rho = sum(max(0, r - G))  (the probability that c was rejected)
    accept u with probability m = sum(G) (the root always), the bonus drawn from G / m; else reject u.
Claim: for every node u, given that process(u, a_u) runs, P(it accepts a node at or below u, and the
token after u is y) = a_u * p_u(y), averaging over u's draft subtree and the verifier's draws.
Induction over the height: a leaf accepts with probability a_u and draws y ~ p_u. At child c_j, let
G_j be G before it; averaging over x ~ r_j, the accept-through-c_j term gives r_j(y) a_c(y) =
min(r_j(y), G_j(y)) (induction on c_j), and the rejection term gives rho_j * G_{j+1}(y) =
max(0, G_j(y) - r_j(y)); they sum to G_j(y). G_{j+1} does not depend on x_j, so later siblings
(whose rows may depend on x_j) see the same G whichever x_j was drawn; unrolled, the stop term
m * (G/m) closes the sum to G_1 = a_u p_u. At the root a = 1 and the mass of G stays 1, so the first
emitted token follows p_root and, recursively, every next token follows p given its prefix:
lossless (also with duplicate siblings: a rejected duplicate has a = 0).

Soundness needs more than tree-rrs: the rejection of c_j depends on c_j's whole subtree, so that
subtree (given its path) must be drawn independently of c_j's later siblings. Samplers that expand
every node from its own path (`specbench.verify.draft_sampling.sample_tree`) satisfy this.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.trees.base import DraftTree
from specbench.verify import VERIFIERS
from specbench.verify.base import Randomness, Verifier, VerifyResult
from specbench.verify.laws import check_drawable, draft_rows, normalised


def traversal(tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
    """The module docstring's rule. Returns the accepted path and the bonus."""
    tokens, _, _ = tree.host
    children = tree.children
    probs = normalised(target_probs)  # [N, V]
    rows = draft_rows(tree, probs.shape[-1])  # [N, V]

    def process(u: int, weight: float) -> tuple[int, int] | None:
        g = weight * probs[u]  # [V] sub-probability
        for c in children[u]:
            x = tokens[c]
            q_x = float(rows[c, x])
            check_drawable(c, q_x)
            a_c = min(1.0, float(g[x]) / q_x)
            if a_c > 0:
                accepted = process(c, a_c)
                if accepted is not None:
                    return accepted
            rho = (rows[c] - g).clamp(min=0).sum()
            g = (g - rows[c]).clamp(min=0) / rho if rho > 0 else torch.zeros_like(g)
        if u == 0:
            return 0, rng.categorical(g if bool(g.sum() > 0) else probs[0])
        if rng.bernoulli(float(g.sum())):
            return u, rng.categorical(g)
        return None

    result = process(0, 1.0)
    assert result is not None  # the root always accepts
    node, bonus = result
    path = tree.path_to(node)
    return VerifyResult(path=path, tokens=[tokens[i] for i in path[1:]] + [bonus])


@VERIFIERS.register("traversal")
class Traversal(Verifier):
    """Traversal verification: leaf-to-root, sequence-level acceptance over a sampled (or
    deterministic, draft_probs None) tree."""

    lossless = True
    needs_draft_probs = True

    def verify_probs(self, tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
        return traversal(tree, target_probs, rng)
