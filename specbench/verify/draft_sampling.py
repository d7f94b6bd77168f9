"""Sampled draft trees and what their `draft_probs` rows mean (the contract drafters follow).

`DraftTree.draft_probs[i]` is the processed law node i's token was drawn from, given everything drawn
before it (row 0, the root, is unused); `draft_probs is None` means every token was a deterministic
choice (a point mass). Siblings are verified in node order, which must be the order they were drawn:
  - with replacement (SpecInfer): every child of u is drawn from q_u, so every sibling row is q_u;
    duplicate sibling tokens happen and stay in the tree as separate nodes;
  - without replacement: the j-th child is drawn from q_u with siblings 1..j-1 zeroed and
    renormalised, and that conditional law is its row (the verifier reads the "updated draft
    distribution" from the rows; no duplicates can occur).
Which children exist may depend on anything drawn earlier (e.g. stop when q_u's support is
exhausted) but never on the draws of those children themselves (non-anticipation; docs/methods.md,
"Sampled trees and non-anticipation"): a tree must not be pruned or deduplicated by the tokens it drew. For `traversal` each node's subtree
must also be drawn from its own path, independently of its later siblings, as `sample_tree` does.

`DraftTree.validate()` rejects duplicate (parent, token) pairs, so call it only on trees drawn
without replacement or deterministically.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from specbench.trees.base import DraftTree
from specbench.verify.base import Randomness
from specbench.verify.laws import normalised


def sample_tree(
    anchor: int,
    draft_law: Callable[[tuple[int, ...]], Tensor],
    shape: Sequence[int],
    rng: Randomness,
    replacement: bool = True,
    record_probs: bool = True,
) -> DraftTree:
    """Draw a tree of the template `shape` (parents list, shape[0] = -1, parents precede children).

    draft_law(path) [V]: the law of a child of the node whose tokens below the anchor are `path`.
    Template nodes are drawn in order. Without replacement, a template child whose parent's law has
    no mass left is dropped with its template subtree. record_probs=False leaves draft_probs None
    (only for verifiers that ignore them: sample-walk, tree-rrs-pointmass).
    """
    if not shape or shape[0] != -1 or any(not 0 <= p < i for i, p in enumerate(shape) if i):
        raise ValueError("shape must be a parents list: shape[0] = -1 and 0 <= shape[i] < i")
    new_id = {0: 0}  # template node -> tree node
    tokens, parents, depth, paths = [anchor], [-1], [0], [()]
    rows: list[Tensor | None] = [None]
    left: dict[int, Tensor] = {}  # tree node -> law of its next child
    for t in range(1, len(shape)):
        parent = new_id.get(shape[t])
        if parent is None:
            continue
        if parent not in left:
            left[parent] = normalised(draft_law(paths[parent]))
        law = left[parent]
        if not bool(law.sum() > 0):
            continue
        x = rng.categorical(law)
        if not replacement:
            rest = law.clone()
            rest[x] = 0.0
            left[parent] = rest / rest.sum() if bool(rest.sum() > 0) else rest
        new_id[t] = len(tokens)
        tokens.append(x)
        parents.append(parent)
        depth.append(depth[parent] + 1)
        paths.append(paths[parent] + (x,))
        rows.append(law)
    probs = None
    if record_probs and len(tokens) > 1:
        body = torch.stack([r for r in rows if r is not None])  # [N-1, V]
        probs = torch.cat([torch.zeros_like(body[:1]), body])
    as_t = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return DraftTree(tokens=as_t(tokens), parents=as_t(parents), depth=as_t(depth), draft_probs=probs)
