"""Rejection-sampling verifiers: `chain-rs` (Leviathan/Chen), `tree-rrs` (recursive rejection over a
tree, SpecInfer / RRS without replacement) and `tree-rrs-pointmass` (the EAGLE-2/3 rule).

Draft distributions (see `specbench.verify.draft_sampling` for the full contract): row i of
`tree.draft_probs` is the law node i's token was drawn from *given everything drawn before it*,
including its earlier siblings. For children drawn with replacement every sibling's row is the
drafter's q; for children drawn without replacement the j-th sibling's row is q with the tokens of
siblings 1..j-1 zeroed and renormalised. `draft_probs is None` means every node is a point mass.

The rule at a visited node u (target law p_u, children c_1..c_k in node order = draw order):
    g = p_u
    for each child c with token x and row r:
        accept c with probability min(1, g(x) / r(x)) -> descend into c
        else g = norm(max(0, g - r))
    no child accepted: bonus y ~ g
Each step is one rejection-sampling step of g against the law the child was actually drawn from, so
the token emitted at u follows p_u whatever the order of draws (Chen et al. 2023; SpecInfer; Jeon et
al. 2024 for the without-replacement form, whose "draft update" is carried in the rows). A duplicate
sibling token is rejected with certainty (the first rejection left g(x) = 0) but still updates g, as
the proof requires; it must therefore stay in the tree rather than be merged away. With one-hot rows
the rule is the EAGLE rule: accept x with probability g(x), else zero g(x) and renormalise.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.config import SamplingConfig
from specbench.trees.base import DraftTree
from specbench.verify import VERIFIERS
from specbench.verify.base import Randomness, Verifier, VerifyResult
from specbench.verify.laws import check_drawable, draft_rows, normalised, residual
from specbench.verify.sampling import process_logits
from specbench.verify.vectorised import chain_rs_batched


def rrs_walk(tree: DraftTree, target_probs: Tensor, rng: Randomness, use_draft_probs: bool) -> VerifyResult:
    """Recursive rejection sampling from the root (the module docstring's rule)."""
    tokens, _, _ = tree.host
    children = tree.children
    probs = normalised(target_probs)  # [N, V]
    rows = draft_rows(tree, probs.shape[-1], use_draft_probs)  # [N, V]
    node, path, out = 0, [0], []
    while True:
        g = probs[node]  # [V]
        for c in children[node]:
            x = torch.tensor(tokens[c], device=g.device)
            q_x = rows[c, x]
            check_drawable(c, float(q_x))
            if rng.bernoulli(float(g[x] / q_x)):
                node = c
                break
            g = residual(g, rows[c], x)
            g = g / g.sum()
        else:
            out.append(rng.categorical(g))
            return VerifyResult(path=path, tokens=out)
        path.append(node)
        out.append(tokens[node])


def chain_rs(tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
    """Speculative sampling on a chain: accept x_k with probability min(1, p(x_k)/q(x_k)); at the first
    rejection the bonus comes from max(0, p - q) (unnormalised: `categorical` normalises); if all are
    accepted, from the last node's p. Point-mass drafts: q = one-hot(x_k)."""
    tokens, parents, _ = tree.host
    if parents != list(range(-1, len(parents) - 1)):
        raise ValueError("chain-rs verifies a single chain (node i's parent is i-1); use tree-rrs for trees")
    probs = normalised(target_probs)  # [N, V]
    rows = draft_rows(tree, probs.shape[-1])  # [N, V]
    n = tree.num_nodes
    for u in range(n - 1):
        x = torch.tensor(tokens[u + 1], device=probs.device)
        q_x = rows[u + 1, x]
        check_drawable(u + 1, float(q_x))
        if not rng.bernoulli(float(probs[u, x] / q_x)):
            bonus = rng.categorical(residual(probs[u:u + 1], rows[u + 1:u + 2], x.view(1))[0])
            return VerifyResult(path=list(range(u + 1)), tokens=tokens[1:u + 1] + [bonus])
    return VerifyResult(path=list(range(n)), tokens=tokens[1:] + [rng.categorical(probs[n - 1])])


@VERIFIERS.register("chain-rs")
class ChainRS(Verifier):
    """Leviathan/Chen speculative sampling on a chain; vectorised unless `vectorised=False` (the
    reference rule above is what `exact_law` enumerates; both agree draw for draw)."""

    lossless = True
    needs_draft_probs = True
    chains_only = True

    def __init__(self, vectorised: bool = True) -> None:
        self.vectorised = vectorised

    def verify(self, tree: DraftTree, target_logits: Tensor, sampling: SamplingConfig, rng: Randomness) -> VerifyResult:
        probs = process_logits(target_logits, sampling)
        if self.vectorised and rng.draws_uniforms:
            return chain_rs_batched(tree, probs, rng.uniform(tree.num_nodes))
        return self.verify_probs(tree, probs, rng)

    def verify_probs(self, tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
        return chain_rs(tree, target_probs, rng)


@VERIFIERS.register("tree-rrs")
class TreeRRS(Verifier):
    """Multi-draft recursive rejection sampling over a sampled tree (children drawn with replacement,
    SpecInfer, or without replacement, RRS-w/o: the rows say which). draft_probs None = point masses."""

    lossless = True
    needs_draft_probs = True

    def verify_probs(self, tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
        return rrs_walk(tree, target_probs, rng, use_draft_probs=True)


@VERIFIERS.register("tree-rrs-pointmass")
class TreeRRSPointMass(Verifier):
    """The EAGLE-2/3 rule for deterministic (top-k) children: accept child x with probability g(x),
    else zero g(x) and renormalise; bonus from what is left. Ignores draft_probs, so it is lossless for
    any tree fixed before verification (its law equals sample-walk's)."""

    lossless = True
    needs_draft_probs = False

    def verify_probs(self, tree: DraftTree, target_probs: Tensor, rng: Randomness) -> VerifyResult:
        return rrs_walk(tree, target_probs, rng, use_draft_probs=False)
