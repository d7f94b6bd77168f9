"""A context n-gram expert for foresight's outcome scores (our addition to the calibration of
`calibration.py`; the paper's App. B.1 is not public).

Why: on recorded rounds the verified outcomes that top-B misses are almost all the right stop node
with the wrong bonus (docs/measurements/foresight_hits_ngram_*): the decoder's row ranks the target's
next token too low. Prompt-lookup statistics know many of those tokens: math and reasoning answers
repeat numbers and names of the prompt and of what was generated. The expert adds, to the logit of
token t in node u's row, eta_1 + .. + eta_level(u, t), where level 1 means t occurs in the committed
context and level k + 1 that the last k tokens (k <= ORDERS) of (committed context, path to u) occur
there followed by t:

    log p~(t | u) = beta_d z_u[t] + sum_{i <= level(u, t)} eta_i - log Z_u

a product of experts with an indicator expert per level, so p~ stays a distribution, the outcome
law over p~ still sums to 1, and the NLL of verified outcomes stays convex in (beta, eta).
Non-anticipation: it reads the committed tokens and the block's own tokens, nothing verification
decides. The dense form (`boost`) is static-shaped tensor ops (capturable, the device round's); the
compact form (`ContextStats`) is what a recorded round keeps: per node, the continuation tokens, their
levels and the decoder's raw logits for them, enough to rebuild p~ at any (beta, eta >= 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from specbench.drafters.jetspecpp.selection import RowLaw, RowStats

ORDERS = 3  # n-gram keys of 1..3 tokens: levels 1 (presence) .. 4
LEVELS = ORDERS + 1  # what records keep


def suffixes(context: Tensor, length: Tensor, tokens: Tensor, depth: Tensor, ancestors: Tensor, orders: int) -> Tensor:
    """[N, orders]: entry i-1 is the i-th last token of (context[: length + 1], path to node u) (the
    root is context[length], the anchor); -1 where that runs before the context's start.
    context [S] committed tokens (slots past length unread), length [1]."""
    n = tokens.shape[0]
    want = depth[:, None] - torch.arange(orders, device=tokens.device)[None]  # [N, o]: the depth of the i-th last
    # a node's ancestor at depth e (>= 0): the tree token; e < 0 reaches back into the context
    at = ancestors[:, None, :] & (depth[None, None, :] == want[:, :, None])  # [N, o, N]
    tree_tok = torch.where(at, tokens[None, None, :], 0).sum(dim=-1)  # exactly one ancestor per depth >= 0
    pos = length + want  # want < 0: context position length + want (the root sits at `length`)
    ctx_tok = context[pos.clamp(min=0, max=context.shape[0] - 1)]
    ctx_tok = torch.where(pos >= 0, ctx_tok, -1)
    return torch.where(want >= 0, tree_tok, ctx_tok).view(n, orders)


def match_levels(context: Tensor, length: Tensor, tokens: Tensor, depth: Tensor, ancestors: Tensor,
                 orders: int) -> Tensor:
    """[N, S] int64: the level of context position j for node u: 0 past length, else 1 + the longest
    k <= orders with context[j-k..j-1] equal to the last k tokens of (context, path to u); context[j]
    is then a level continuation of u (level 1: it occurs in the context)."""
    s = context.shape[0]
    suf = suffixes(context, length, tokens, depth, ancestors, orders)  # [N, o]
    j = torch.arange(s, device=context.device)
    run = torch.ones(tokens.shape[0], s, dtype=torch.bool, device=context.device)
    order = torch.zeros(tokens.shape[0], s, dtype=torch.long, device=context.device)
    for i in range(1, orders + 1):
        before = context[(j - i).clamp(min=0)]  # [S]: context[j - i]
        run = run & (suf[:, i - 1 : i] == before[None]) & (j >= i)[None]
        order = order + run.long()
    return torch.where((j <= length)[None], order + 1, 0)


def token_levels(context: Tensor, match: Tensor, vocab: int) -> Tensor:
    """[N, V] int64: level(u, t) = the highest match level of a context position holding t (0: t is
    not in the context)."""
    index = context.clamp(min=0)[None].expand_as(match)
    return torch.zeros(match.shape[0], vocab, dtype=torch.long, device=match.device).scatter_reduce(
        1, index, match, reduce="amax")


def boost(levels_ut: Tensor, etas: Tensor) -> Tensor:
    """[N, V] (etas' dtype): sum_{i <= level(u, t)} eta_i from token levels [N, V] and etas [L] (a level
    beyond len(etas): the sum of all)."""
    table = torch.cat([etas.new_zeros(1), etas.cumsum(0)])  # [o + 1]
    return table[levels_ut.clamp(max=etas.shape[0])]


@dataclass
class ContextStats:
    """What a recorded round keeps of the expert: per node its continuation tokens ids [N, C] (-1
    padded), their levels [N, C] (0 on padding) and the decoder's raw logits for them [N, C]."""

    ids: Tensor
    levels: Tensor
    logits: Tensor

    @staticmethod
    def from_levels(levels_ut: Tensor, logits: Tensor) -> "ContextStats":
        """token levels [N, V], the decoder's raw logits [N, V]."""
        width = max(1, int((levels_ut > 0).sum(dim=1).max()))
        top, ids = levels_ut.topk(width, dim=1)  # the continuations first
        ids = torch.where(top > 0, ids, -1)
        return ContextStats(ids=ids.cpu(), levels=top.cpu(),
                            logits=torch.where(top > 0, logits.gather(1, ids.clamp(min=0)).double(), 0.0).cpu())


def log_partition(lse: Tensor, beta: Tensor, ctx: ContextStats, etas: Tensor) -> Tensor:
    """[N]: log Z_u of the boosted rows from lse [N] = logsumexp(beta z_u) over the vocabulary, beta
    [N], etas [o] >= 0: Z = e^lse + sum over the continuations of e^(beta z) (e^boost - 1)."""
    b = boost(ctx.levels, etas)  # [N, C]
    extra = torch.where(ctx.ids >= 0, torch.exp(beta[:, None] * ctx.logits - lse[:, None]) * torch.expm1(b), 0.0)
    return lse + torch.log1p(extra.sum(dim=1))


def boosted_law(stats: RowStats, column: Tensor, parents: Tensor, ctx: ContextStats, etas: Tensor,
                tokens: Tensor) -> RowLaw:
    """The RowLaw of the boosted rows (row u at inverse temperature stats.betas[column[u]], etas >= 0)
    from a record: the candidates are the kept top-K and the continuations; with etas >= 0 a token
    outside both never outranks the K-th kept one, so the top-K of the boosted row is among them."""
    if bool((etas < 0).any()):
        raise ValueError(f"the n-gram boosts must be >= 0 (a record keeps too few tokens otherwise), got {etas.tolist()}")
    beta = stats.betas[column]  # [N]
    lse = stats.lse.gather(1, column[:, None])[:, 0]
    log_z = log_partition(lse, beta, ctx, etas)  # [N]
    b = boost(ctx.levels, etas)
    ids = torch.cat([stats.ids, ctx.ids], dim=1)  # [N, K + C]
    raw = torch.cat([stats.logits, ctx.logits], dim=1)
    # a kept token's boost: its continuation entry's, if any
    hit = stats.ids[:, :, None] == ctx.ids[:, None, :]  # [N, K, C]
    kept_boost = torch.where(hit, b[:, None, :], 0.0).amax(dim=-1) if ctx.ids.shape[1] else torch.zeros_like(stats.logits)
    dup = hit.any(dim=1) | (ctx.ids < 0)  # continuation entries already kept (or padding): drop
    extra_boost = torch.where(dup, -math.inf, b)
    logp = beta[:, None] * raw + torch.cat([kept_boost, extra_boost], dim=1) - log_z[:, None]
    k = stats.ids.shape[1]
    logp, order = logp.topk(k, dim=1)
    ids = ids.gather(1, order)
    # node v's token in its parent's row
    parent = parents.clamp(min=0)
    child_hit = ctx.ids[parent] == tokens[:, None]  # [N, C]
    child_boost = torch.where(child_hit, b[parent], 0.0).amax(dim=1) if ctx.ids.shape[1] else torch.zeros_like(lse)
    child = beta[parent] * stats.child_logit + child_boost - log_z[parent]
    return RowLaw(ids=ids, logp=logp, child_logp=torch.where(parents >= 0, child, torch.zeros_like(child)))


def tree_levels(context: Tensor, length: Tensor, tokens: Tensor, depth: Tensor, ancestors: Tensor, orders: int,
                vocab: int) -> Tensor:
    """[N, V] int64: level(u, t) (keys of up to `orders` tokens) for every node of the tree (tokens,
    depth [N], ancestors [N, N]) against committed context [S] (length [1]: the anchor's position)."""
    return token_levels(context, match_levels(context, length, tokens, depth, ancestors, orders), vocab)
