"""Vectorised (batched, GPU-friendly) `greedy`, `sample-walk` and `chain-rs`: no Python loop over
nodes, one host read per call.

Randomness comes as pre-drawn uniforms, one per node, used through the same rules as the scalar
primitives (`u < p`, `inverse_cdf`): sample-walk samples node i's target law at u[i]; chain-rs
accepts node i+1 iff u[i] < p_i(x)/q(x) and draws the bonus at u[N-1]. Replaying the uniforms a
visited node used (`replayed_uniforms`) through `ReplayRandomness` makes the reference rule take
exactly the same decisions, which is how the two are tested equal.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.trees.base import DraftTree
from specbench.verify.base import VerifyResult, inverse_cdf, read_acceptance
from specbench.verify.laws import draft_rows, normalised, residual


def first_of_token(tree: DraftTree) -> Tensor:
    """[N] bool: False for a node whose earlier sibling has the same token (a walk takes the first)."""
    n = tree.num_nodes
    same = (tree.parents[:, None] == tree.parents[None, :]) & (tree.tokens[:, None] == tree.tokens[None, :])
    earlier = torch.ones(n, n, dtype=torch.bool, device=tree.device).tril_(-1)  # [i, j]: j < i
    return ~(same & earlier).any(dim=-1)


def accept_packed(tree: DraftTree, picks: Tensor, use_kernel: bool | None = None) -> Tensor:
    """picks [N]: the target's token at every node. The deepest node whose whole path matches (node j
    matches when its token is its parent's pick and no earlier sibling has that token), packed as
    `Acceptance.packed` [2 + N], with no host read. On CUDA (use_kernel None) the Triton `tree_accept`
    kernel does it in one launch. Parentless nodes other than the root are padding: never accepted."""
    n = tree.num_nodes
    if (picks.is_cuda if use_kernel is None else use_kernel) and n <= 1024:
        from specbench.kernels.tree_accept import tree_accept

        return tree_accept(tree.tokens, tree.parents, picks.to(tree.device)).packed
    ids = torch.arange(n, device=tree.device)
    has_parent = tree.parents >= 0
    match = (ids == 0) | (has_parent & (tree.tokens == picks[tree.parents.clamp(min=0)]) & first_of_token(tree))
    on_path = ~(tree.ancestor_mask & ~match[None, :]).any(dim=-1)  # [N]: every ancestor matched
    deepest = torch.where(on_path, tree.depth, -1).argmax().view(1)  # [1]: a 0-d index would be read back
    along = tree.ancestor_mask[deepest][0]  # [N]: the accepted path's nodes
    path = torch.full((n + 1,), -1, dtype=torch.long, device=tree.device)
    path.scatter_(0, torch.where(along, tree.depth, n), ids)  # node at depth d -> slot d; others -> slot n
    return torch.cat([along.sum().view(1), picks[deepest], path[:n]])


def walk_batched(tree: DraftTree, picks: Tensor, use_kernel: bool | None = None) -> VerifyResult:
    """`accept_packed` read back to the host (one read of the packed result and the tree's tokens)."""
    packed = accept_packed(tree, picks, use_kernel)
    return read_acceptance(torch.cat([packed, tree.tokens.to(packed.device)]).tolist(), tree.num_nodes)


def greedy_batched(tree: DraftTree, scores: Tensor) -> VerifyResult:
    """scores [N, V]: logits or probabilities (argmax, lowest id on ties)."""
    return walk_batched(tree, scores.argmax(dim=-1))


def sample_walk_batched(tree: DraftTree, target_probs: Tensor, uniforms: Tensor) -> VerifyResult:
    """target_probs [N, V], uniforms [N]: node i's target sample is inverse_cdf(p_i, u_i)."""
    return walk_batched(tree, inverse_cdf(target_probs, uniforms.to(target_probs.device)))


def chain_rs_batched(tree: DraftTree, target_probs: Tensor, uniforms: Tensor) -> VerifyResult:
    """Speculative sampling on a chain, all positions at once. uniforms [N]: u[i] decides node i+1,
    u[N-1] draws the bonus."""
    n = tree.num_nodes
    dev = target_probs.device
    u = uniforms.to(device=dev, dtype=torch.float64)
    probs = normalised(target_probs)  # [N, V]
    rows = draft_rows(tree, probs.shape[-1])  # [N, V]
    x = tree.tokens[1:, None]  # [D, 1]
    p_x = probs[:-1].gather(1, x).squeeze(1)  # [D]: target prob of each draft token at its parent
    q_x = rows[1:].gather(1, x).squeeze(1)  # [D]
    accepted = (u[: n - 1] < p_x / q_x).long().cumprod(0).sum().view(1)  # [1]: leading accepts
    bonus_laws = torch.cat([residual(probs[:-1], rows[1:], x.squeeze(1)), probs[-1:]])  # [N, V]: stop at i
    bonus = inverse_cdf(bonus_laws.index_select(0, accepted), u[n - 1:])  # [1]
    bad_q = (~(q_x > 0)).any().long().view(1)  # zero or NaN
    not_chain = (tree.parents != torch.arange(-1, n - 1, device=tree.device)).any().long().view(1)
    packed = torch.cat([accepted, bonus, bad_q, not_chain, tree.tokens]).tolist()
    if packed[3]:
        raise ValueError("chain-rs verifies a single chain (node i's parent is i-1); use tree-rrs for trees")
    if packed[2]:
        raise ValueError("a node's token has draft probability 0 (or NaN) under its draft_probs row: rows must be "
                         "the law the token was drawn from (use draft_probs=None for deterministic drafts)")
    k = packed[0]
    return VerifyResult(path=list(range(k + 1)), tokens=packed[5:5 + k] + [packed[1]])


def replayed_uniforms(verifier: str, tree: DraftTree, result: VerifyResult, uniforms: Tensor) -> Tensor:
    """The uniforms, in call order, that the reference rule of `verifier` ("sample-walk" or
    "chain-rs") draws when it takes the decisions in `result` with per-node uniforms `uniforms`."""
    if verifier == "sample-walk":
        return uniforms[result.path]
    if verifier == "chain-rs":
        n, k = tree.num_nodes, result.accepted_drafts
        return torch.cat([uniforms[: min(k + 1, n - 1)], uniforms[n - 1:]])
    raise ValueError(f"no vectorised form of {verifier!r}; vectorised: sample-walk, chain-rs")
