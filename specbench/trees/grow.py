"""Growing a tree with an autoregressive drafter, depth by depth (EAGLE-2, chain, static templates).

An autoregressive drafter (the `self` drafter, EAGLE-3) cannot hand a policy per-depth scores up
front: the distribution below a node depends on the node's path. It hands the policy a callback
instead:

    expand(tree, frontier) -> logp [F, V]

`tree` is the tree grown so far (node 0 = anchor; a `DraftTree` with tokens/parents/depth/scores);
`frontier` [F] (int64, on the tree's device) are ids of nodes of one depth d; the callback returns, for
each, the drafter's full-vocabulary log-probs of the token that follows the node's root path. The
drafter runs its model on the frontier nodes with tree attention: each frontier node attends to the
committed context and to its own ancestors in `tree` (`frontier_subtree` gives exactly that subtree).
Every ancestor of a frontier node was itself a frontier node of an earlier call (depths are expanded in
order, the root first, each in one call: the p-th call's frontier is at depth p - 1), so a drafter that
keeps draft-side K/V per expanded node only ever appends, and knows each call's depth without reading it.

A policy that can grow declares `can_grow = True` and overrides

    policy.grow(anchor, expand, budget, max_depth, device) -> DraftTree

(`chain`, `eagle2`, `static`); the base class's `grow` raises a TreeError naming the policies that
can. Drafters call `grow_tree(policy, ...)`, which checks the arguments first. The grown tree's
`scores` are cumulative draft log-probs (float32); its `draft_probs` are None (tokens are chosen by
rank, deterministically).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from specbench.trees.base import (Anchor, DepthScores, DraftTree, TreeError, TreePolicy, anchor_tensor, check_budget,
                                  select_top_scores)
from specbench.trees.ranking import ranked_topk, top_indices

ExpandFn = Callable[[DraftTree, Tensor], Tensor]
"""expand(tree so far, frontier node ids [F]) -> next-token log-probs [F, V] at those nodes."""

TopkFn = Callable[[DraftTree, Tensor, int], tuple[Tensor, Tensor]]
"""topk(tree so far, frontier [F], k) -> (tokens [F, k], logp [F, k]) ranked; what growers consume."""


def grow_tree(policy: TreePolicy, anchor: int, expand: ExpandFn, budget: int, max_depth: int,
              device: torch.device | str = "cpu") -> DraftTree:
    """What an autoregressive drafter calls: `policy.grow(...)` after checking budget and depth (a
    policy that cannot grow raises a TreeError naming those that can)."""
    if max_depth < 0:
        raise TreeError(f"max_depth must be >= 0, got {max_depth}")
    return policy.grow(anchor, expand, check_budget(budget), max_depth, device)


def ranked_expand(expand: ExpandFn) -> TopkFn:
    """The ranked top-k of each frontier row of `expand` (ties: lower token id). An `expand` object with
    a `ranked(tree, frontier, k)` method (the same top-k, from a drafter that ranks a smaller vocabulary
    itself: eagle3's draft vocabulary) is used through that method."""
    ranked = getattr(expand, "ranked", None)
    if ranked is not None:
        return ranked

    def topk(tree: DraftTree, frontier: Tensor, k: int) -> tuple[Tensor, Tensor]:
        logp = expand(tree, frontier)
        if logp.dim() != 2 or logp.shape[0] != frontier.shape[0]:
            raise TreeError(f"expand() must return log-probs [F={frontier.shape[0]}, V], got shape "
                            f"{tuple(logp.shape)}")
        vals, idx = ranked_topk(logp, k)
        return idx, vals

    return topk


def factorised_topk(scores: DepthScores) -> TopkFn:
    """A parallel drafter's per-depth scores as a grower's input: every node of depth d gets depth
    d+1's row (the factorised surrogate). Ranks each depth once, not once per frontier node."""
    tables: dict[int, tuple[Tensor, Tensor]] = {}

    def topk(tree: DraftTree, frontier: Tensor, k: int) -> tuple[Tensor, Tensor]:
        if k not in tables:
            tables[k] = scores.topk(k)
        tok, lp = tables[k]
        rows = tree.depth[frontier]  # a node at depth d takes the row of depth d + 1 (index d)
        return tok[rows], lp[rows]

    return topk


def frontier_subtree(tree: DraftTree, frontier: Tensor) -> tuple[DraftTree, Tensor]:
    """(sub, rows): the union of the frontier nodes' root paths as a tree (node order kept, root first)
    and the row of each frontier node in it. A drafter without draft-side K/V for earlier nodes runs
    its model on sub's non-root nodes (positions = cache_len + sub.depth, mask = sub.ancestor_mask)
    and reads the logits at `rows`."""
    frontier = frontier.contiguous()  # (a grower may pass a strided view)
    keep = tree.ancestor_mask[frontier].any(dim=0).nonzero().flatten()  # sorted node ids
    return tree.subtree(keep), torch.searchsorted(keep, frontier)


def beam_grow(anchor: Anchor, topk: TopkFn, budget: int, width: int, depth: int,
              device: torch.device | str = "cpu", use_kernel: bool | None = None) -> DraftTree:
    """EAGLE-2's dynamic tree. The root's `width` best children are the first beams; at each further
    depth every beam gets its `width` best children (scored by cumulative log-prob), all of them become
    candidates, and the `width` best candidates are the next beams. Finally the `budget` best
    candidates are kept (a parent always outscores or ties and precedes its children).

    Candidate ids are laid out by (depth, beam place, rank), so "score, then lower id" is the
    package's tie rule; beams are chosen by the same rule. `depth` frontiers are expanded (root
    included): EAGLE-2's `depth` setting d expands d+1 frontiers. The candidates are written into
    buffers allocated once for the largest layout (`width` children a beam), so a depth costs a few
    kernels and `topk` sees views of the tree so far (no concatenation): the depths of the layout are
    written once, the next beams' ids straight into the next block's parents, and the last depth
    chooses no beams. A depth's bookkeeping after the top-k is `beam_step_ops`, or on CUDA (`use_kernel`
    None) one launch of `kernels.beam_step` (the same arrays).
    """
    depth = min(depth, budget)
    size = 1 + sum(beams * width for beams in _beam_counts(width, depth))
    tokens = torch.empty(size, dtype=torch.long, device=device)
    parents, depths = torch.empty_like(tokens), torch.empty_like(tokens)
    scores = torch.empty(size, dtype=torch.float32, device=device)
    tokens[:1].copy_(anchor_tensor(anchor, device))
    parents[: 1 + width].fill_(0)  # the root's children (the root's own entry next)
    parents[:1].fill_(-1)
    _layout_depths(width, depths)  # all depths at once (rewritten depth by depth if the layout is not regular)
    scores[:1].fill_(0.0)
    frontier = parents[1:2]  # [1]: the root (node 0), a view
    beam_scores = scores[:1]
    count = 1
    for d in range(depth):
        tree = DraftTree(tokens[:count], parents[:count], depths[:count], scores=scores[:count], depth_bound=d)
        tok, lp = topk(tree, frontier, width)  # [F, k]
        f, k = tok.shape
        end = count + f * k
        if k < width:  # fewer children than width (a tiny vocabulary): not the regular layout
            depths[count:end].fill_(d + 1)
        # the next beams (none after the last depth); their ids are the next block's parents
        nxt = parents[end: end + min(width, f * k) * k] if d + 1 < depth else None
        step = beam_step_kernel if (tok.is_cuda if use_kernel is None else use_kernel) else beam_step_ops
        beam_scores = step(tok, lp, beam_scores, tokens[count:end], scores[count:end], nxt, count, width)
        if nxt is not None:
            frontier = nxt.view(-1, k)[:, 0]
        count = end
    candidates = DraftTree(tokens[:count], parents[:count], depths[:count], scores=scores[:count], depth_bound=depth)
    return select_top_scores(candidates, budget)


def beam_step_ops(tok: Tensor, lp: Tensor, beam_scores: Tensor, out_tokens: Tensor, out_scores: Tensor,
                  next_parents: Tensor | None, count: int, width: int) -> Tensor | None:
    """A depth of `beam_grow` after its top-k, in tensor ops (every device; the reference of
    `kernels.beam_step.beam_step`): the F*k candidates' tokens and scores (beam + min(log-prob, 0)) into
    out_tokens / out_scores [F*k]; with `next_parents` [W*k], the W = min(width, F*k) best candidates (a stable
    descending sort: equal scores by lower place) as the next beams, each one's id (count + place) written k
    times; returns their scores [W] (None without `next_parents`)."""
    f, k = tok.shape
    torch.add(beam_scores[:, None], lp.float().clamp(max=0.0), out=out_scores.view(f, k))
    out_tokens.view(f, k).copy_(tok)
    if next_parents is None:
        return None
    best = top_indices(out_scores, width)  # [W] places in this block
    nxt = next_parents.view(-1, k)  # [W, k]
    torch.add(best[:, None].expand_as(nxt), count, out=nxt)
    return out_scores[best]


def beam_step_kernel(tok: Tensor, lp: Tensor, beam_scores: Tensor, out_tokens: Tensor, out_scores: Tensor,
                     next_parents: Tensor | None, count: int, width: int) -> Tensor | None:
    """`beam_step_ops` in one Triton launch (`specbench.kernels.beam_step`), where it holds the candidates."""
    from specbench.kernels.beam_step import MAX_CANDIDATES, beam_step

    if tok.numel() > MAX_CANDIDATES:
        return beam_step_ops(tok, lp, beam_scores, out_tokens, out_scores, next_parents, count, width)
    return beam_step(tok, lp, beam_scores, out_tokens, out_scores, next_parents, count, width)


def _layout_depths(width: int, out: Tensor) -> Tensor:
    """Fill out [size] with the depth of each slot of `beam_grow`'s regular layout (the root, then blocks
    of width, width**2, width**2, ... nodes at depths 1, 2, 3, ...) in a few kernels instead of a fill a
    depth: slot i >= 1 sits at depth 2 + floor((i - 1 - width) / width**2), the root at 0."""
    sq, size = width * width, out.numel()
    torch.arange(2 * sq - 1 - width, 2 * sq - 1 - width + size, out=out).div_(sq, rounding_mode="floor")
    if width > 1:  # width 1 (a chain): slot i at depth i, the root's 0 included
        out[:1].fill_(0)
    return out


def _beam_counts(width: int, depth: int) -> list[int]:
    """Beams expanded at each of `depth` depths with `width` children each (1 root, then <= width)."""
    counts, beams = [], 1
    for _ in range(depth):
        counts.append(beams)
        beams = min(width, beams * width)
    return counts
