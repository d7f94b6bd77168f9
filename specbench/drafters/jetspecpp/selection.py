"""Which verification outcomes foresight drafts ahead for (methods.md §5.1 item 6; JetSpec++ Tables 10-11).

Verifying a tree ends in an outcome (u, a): the walk stops at node u (the path root -> u is accepted)
and emits the bonus a, a token that is not one of u's children. With per-node next-token rows p(.|u)
the outcome has the law of `outcomes.py`, score(u, a) = reach(u) p(a|u) [a not a child of u], where
reach(u) is the product of the rows along the path (a later sibling repeating an earlier sibling's
token is never reached). A rule picks at most B outcomes, in priority order:

  top        the B outcomes of highest score (decoder rows: the paper's served rule, top-B of P̂)
  threshold  those of them whose score is >= lam (the paper's "calibrated score >= λ")
  ssd        SSD-style geometric fan-out (methods.md §9.1): depth d gets a share of B proportional to
             ratio^d (split over a depth's nodes by reach), each node's slots go to its most probable
             bonus tokens; the share ignores how likely the walk is to stop there. Apportioned by
             Sainte-Laguë: slot r of node u has priority w_u / (2r + 1), the B highest win.

The rows are the decoder's p̂ (calibrated or not: `calibration.py`) or the draft model's own
per-depth distributions (`draft_rows`): Table 11's rows are rule x rows. Everything is tensor ops on
the rows' device with static shapes (B outcomes, padded with invalid ones), so the foresight pass
needs no host read.

`RowLaw` keeps each row's top-K tokens (K >= B + the most children a node has makes every rule
exact: a row's B best non-child tokens are among its top B + children) and each node's own
log-prob in its parent's row, which is all the rules read; `RowStats` is what a recorded round keeps
of the decoder's logits to rebuild RowLaws at any inverse temperature of a grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

RULES = ("top", "threshold", "ssd")


@dataclass
class RowLaw:
    """Per-node next-token rows, compressed: ids [N, K] (most probable first), logp [N, K] float64
    log-probs normalised over the whole vocabulary, child_logp [N] float64: node v's token in its
    parent's row (the root's is 0)."""

    ids: Tensor
    logp: Tensor
    child_logp: Tensor

    @staticmethod
    def from_logp(rows: Tensor, tokens: Tensor, parents: Tensor, k: int) -> "RowLaw":
        """rows [N, V] log-probs (row u: u's next token) of the tree (tokens, parents [N])."""
        rows = rows.to(torch.float64)
        logp, ids = rows.topk(min(k, rows.shape[-1]), dim=-1)  # [N, K], sorted
        return RowLaw(ids=ids, logp=logp, child_logp=_child_values(rows, tokens, parents))

    def to(self, device: torch.device | str) -> "RowLaw":
        return RowLaw(self.ids.to(device), self.logp.to(device), self.child_logp.to(device))


@dataclass
class RowStats:
    """The decoder's logits [N, V] of one tree, reduced to what RowLaws at inverse temperatures
    `betas` [G] need: top-K ids [N, K] and raw logits [N, K] (temperature scaling keeps a row's
    order), each node's own token's raw logit in its parent's row [N] (root 0), and the log-partition
    lse [N, G] = logsumexp(beta_g * z_u) over the whole vocabulary (betas given on the CPU)."""

    ids: Tensor
    logits: Tensor
    child_logit: Tensor
    lse: Tensor
    betas: Tensor

    @staticmethod
    def from_logits(logits: Tensor, tokens: Tensor, parents: Tensor, k: int, betas: Tensor) -> "RowStats":
        z = logits.to(torch.float64)
        top, ids = z.topk(min(k, z.shape[-1]), dim=-1)
        values = betas.tolist()  # pass CPU betas: no device read
        betas = betas.to(device=z.device, dtype=torch.float64)
        lse = torch.stack([torch.logsumexp(z * b, dim=-1) for b in values], dim=-1)  # [N, G]
        return RowStats(ids=ids, logits=top, child_logit=_child_values(z, tokens, parents), lse=lse, betas=betas)

    def law(self, column: Tensor, parents: Tensor) -> RowLaw:
        """The RowLaw with row u at inverse temperature betas[column[u]] (column [N] int64)."""
        beta = self.betas[column]  # [N]
        lse = self.lse.gather(1, column[:, None])[:, 0]  # [N]
        logp = beta[:, None] * self.logits - lse[:, None]
        parent = parents.clamp(min=0)
        child = torch.where(parents >= 0, beta[parent] * self.child_logit - lse[parent], torch.zeros_like(lse))
        return RowLaw(ids=self.ids, logp=logp, child_logp=child)

    def column_of(self, beta: Tensor) -> Tensor:
        """Column indices [N] of per-row inverse temperatures beta [N] (each must be one of betas)."""
        match = beta.to(self.betas)[:, None] == self.betas[None, :]  # [N, G]
        if not bool(match.any(dim=1).all()):
            raise ValueError(f"inverse temperatures {sorted(set(beta.tolist()))} are not all on this record's grid")
        return match.long().argmax(dim=1)

    def to(self, device: torch.device | str) -> "RowStats":
        return RowStats(*(t.to(device) for t in (self.ids, self.logits, self.child_logit, self.lse, self.betas)))


def _child_values(rows: Tensor, tokens: Tensor, parents: Tensor) -> Tensor:
    """[N]: rows[parent(v), token(v)] (0 at the root)."""
    parent = parents.clamp(min=0)
    vals = rows[parent, tokens]
    return torch.where(parents >= 0, vals, 0.0)


def draft_rows(depth_logp: Tensor, depth: Tensor) -> Tensor:
    """The draft model's own rows for the nodes of its tree: node u's next token is at depth
    depth(u) + 1, row depth(u) of the per-depth log-probs [D, V]; past the block (depth D) the draft
    has no row and the bonus is uniform. Returns [N, V] float64."""
    d, v = depth_logp.shape
    rows = depth_logp.to(torch.float64)[depth.clamp(max=d - 1)]
    uniform = torch.full_like(rows, -math.log(v))
    return torch.where((depth < d)[:, None], rows, uniform)


@dataclass
class Selection:
    """B chosen outcomes in priority order: nodes [B], tokens [B] (the bonus), score [B] float64
    (log reach + log p(bonus)), valid [B] bool (padding and rejected outcomes are not valid)."""

    nodes: Tensor
    tokens: Tensor
    score: Tensor
    valid: Tensor

    def packed(self) -> Tensor:
        """[3, B] int64 (nodes, tokens, valid): one copy to the host."""
        return torch.stack([self.nodes, self.tokens, self.valid.long()])


def outcome_scores(law: RowLaw, tokens: Tensor, parents: Tensor, ancestors: Tensor) -> tuple[Tensor, Tensor]:
    """(score [N, K] float64: log reach(u) + log p(ids[u, k] | u), -inf where that token is a child
    of u; log reach [N]). ancestors [N, N]: mask[i, j] = j is i or an ancestor of i."""
    n = tokens.shape[0]
    idx = torch.arange(n, device=tokens.device)
    sibling = (parents[:, None] == parents[None, :]) & (tokens[:, None] == tokens[None, :]) & (idx[None, :] < idx[:, None])
    step = torch.where(sibling.any(dim=1), -math.inf, law.child_logp)  # scalars: no fill kernels
    step = torch.where(parents >= 0, step, 0.0)  # the root is always reached
    reach = torch.where(ancestors, step[None, :], 0.0).sum(dim=1)  # [N]
    is_child = (parents[None, None, :] == idx[:, None, None]) & (tokens[None, None, :] == law.ids[:, :, None])
    score = torch.where(is_child.any(dim=-1), -math.inf, reach[:, None] + law.logp)
    return score, reach


def select(rule: str, law: RowLaw, tokens: Tensor, parents: Tensor, depth: Tensor, ancestors: Tensor, B: int,
           lam: float | None = None, ratio: float = 0.5) -> Selection:
    """The rule's B outcomes (see the module docstring) of the tree (tokens, parents, depth [N],
    ancestors [N, N]) under rows `law`."""
    if rule not in RULES:
        raise ValueError(f"unknown selection rule {rule!r}; choose one of {RULES}")
    score, reach = outcome_scores(law, tokens, parents, ancestors)  # [N, K], [N]
    if rule == "ssd":
        priority = _fanout_priority(score, reach, depth, ratio)
    else:
        priority = score
    flat = priority.flatten()
    m = min(B, flat.numel())
    top, pos = flat.topk(m)
    k = score.shape[1]
    nodes, cols = pos // k, pos % k
    chosen = score.flatten()[pos]
    valid = torch.isfinite(top) & torch.isfinite(chosen)
    if rule == "threshold":
        if lam is None or not 0.0 < lam <= 1.0:
            raise ValueError(f"the threshold rule needs lam in (0, 1], got {lam!r}")
        valid &= chosen >= math.log(lam)
    sel = Selection(nodes=nodes, tokens=law.ids[nodes, cols], score=chosen, valid=valid)
    return _padded(sel, B) if m < B else sel


def _fanout_priority(score: Tensor, reach: Tensor, depth: Tensor, ratio: float) -> Tensor:
    """[N, K]: log(w_u / (2 r + 1)) for the r-th non-child token of node u, w_u = ratio^depth(u) x
    u's share of its depth's reach; -inf for child tokens."""
    if not 0.0 < ratio:
        raise ValueError(f"the fan-out ratio must be > 0, got {ratio!r}")
    n = depth.shape[0]
    same_depth = depth[:, None] == depth[None, :]  # [N, N]
    level = torch.logsumexp(torch.where(same_depth, reach[None, :], torch.full_like(reach, -math.inf)[None, :]), dim=1)
    share = torch.where(torch.isfinite(reach), reach - level, torch.full_like(reach, -math.inf))  # unreachable: -inf
    log_w = depth.to(reach) * math.log(ratio) + share  # [N]
    allowed = torch.isfinite(score)
    rank = allowed.long().cumsum(dim=1) - 1  # [N, K]: rank among the row's non-child tokens
    prio = log_w[:, None] - torch.log(2.0 * rank.to(reach) + 1.0)
    return torch.where(allowed, prio, torch.full_like(prio, -math.inf)).reshape(n, -1)


def _padded(sel: Selection, B: int) -> Selection:
    pad = B - sel.nodes.shape[0]
    z = sel.nodes.new_zeros(pad)
    return Selection(nodes=torch.cat([sel.nodes, z]), tokens=torch.cat([sel.tokens, z]),
                     score=torch.cat([sel.score, torch.full((pad,), -math.inf, dtype=sel.score.dtype, device=z.device)]),
                     valid=torch.cat([sel.valid, torch.zeros(pad, dtype=torch.bool, device=z.device)]))
