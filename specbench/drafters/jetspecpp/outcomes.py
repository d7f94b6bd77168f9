"""The outcome distribution P̂(k, a) of a drafted block (methods.md §5.1 item 6).

Verifying the chain anchor -> d_1 .. d_γ ends in an outcome (k, a): k drafts accepted, bonus token a.
Under a walk verifier whose target rows are p(·|j) (row j: the law of the token after d_j, row 0
after the anchor) the outcome has the law

    P(k, a) = prod_{i=1..k} p(d_i | i-1) * p(a | k) * [a != d_{k+1}]      (no exclusion at k = γ),

which sums to 1 (the terms telescope). With the training-free decoder's p̂ in place of p this is the
predicted law of the verification outcome that foresight drafting ranks. The tree form is the same
walk: outcome (u, a) = the walk stops at node u with bonus a, a not the token of a child of u; a node
is reached with the product of the rows along its path (a later sibling repeating an earlier
sibling's token is never reached, as in the walk verifiers).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def tree_outcome_distribution(parents: Sequence[int], tokens: Sequence[int], probs: Tensor) -> Tensor:
    """probs [N, V] (row u: the law of u's next token; normalised here, in float64) for the tree
    (parents[0] = -1, parents precede children) -> P [N, V] float64: P[u, a] = reach(u) * p(a|u) *
    [a is not a child token of u]. Sums to 1."""
    n = len(parents)
    if probs.shape[0] != n or len(tokens) != n:
        raise ValueError(f"probs has {probs.shape[0]} rows and tokens {len(tokens)} entries for a tree of {n} nodes")
    p = probs.detach().to(torch.float64)
    p = p / p.sum(dim=-1, keepdim=True)  # [N, V]
    rows = p.cpu().tolist()
    reach = [0.0] * n
    reach[0] = 1.0
    child_tokens: list[dict[int, int]] = [{} for _ in range(n)]  # node -> {token: first child}
    for v in range(1, n):
        u = parents[v]
        if tokens[v] not in child_tokens[u]:
            child_tokens[u][tokens[v]] = v
            reach[v] = reach[u] * rows[u][tokens[v]]
    stop = torch.ones_like(p)  # [N, V]: 1 where the walk stops at u on drawing a
    for u in range(n):
        if child_tokens[u]:
            stop[u, list(child_tokens[u])] = 0.0
    return torch.tensor(reach, dtype=torch.float64, device=p.device)[:, None] * p * stop


def outcome_distribution(drafts: Sequence[int] | Tensor, probs: Tensor) -> Tensor:
    """The chain case: drafts d_1..d_γ, probs [γ+1, V] (rows 0..γ) -> P̂ [γ+1, V] float64, P̂[k, a]
    = the probability that verification accepts k drafts and emits bonus a."""
    d = [int(t) for t in (drafts.tolist() if isinstance(drafts, Tensor) else drafts)]
    parents = list(range(-1, len(d)))
    return tree_outcome_distribution(parents, [-1] + d, probs)
