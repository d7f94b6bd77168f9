"""Attention masks of the draft head. True = may attend.

Keys are laid out as [context features (C) ; block/tree tokens (Q)]. A query sees the context keys
below its own limit (the anchor position: context strictly before the anchor) and the block keys its
within-block pattern allows. The same mask is used by every draft layer (tests check each layer's
effective dependency pattern against it).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

ATTENTION_KINDS = ("bidirectional", "block-causal")


def block_pattern(size: int, attention: str, device: torch.device | str = "cpu") -> Tensor:
    """[b, b] within-block mask: bidirectional = all ones; block-causal = offset j sees offsets <= j."""
    ones = torch.ones(size, size, dtype=torch.bool, device=device)
    if attention == "bidirectional":
        return ones
    if attention == "block-causal":
        return ones.tril_()
    raise ValueError(f"unknown block attention {attention!r}; choose one of {ATTENTION_KINDS}")


def grouped_mask(ctx_limit: Tensor, within: Sequence[Tensor], ctx_len: int) -> Tensor:
    """Mask for several groups (blocks or trees) of queries over one shared context.

    ctx_limit [G]: group g's queries see context keys 0..ctx_limit[g]-1; within[g] [n_g, n_g] is the
    group's own pattern (groups never see each other). Returns [sum n_g, ctx_len + sum n_g] bool.
    """
    device = ctx_limit.device
    sizes = torch.tensor([w.shape[0] for w in within], device=device)
    per_query_limit = ctx_limit.repeat_interleave(sizes)  # [Q]
    ctx = torch.arange(ctx_len, device=device)[None, :] < per_query_limit[:, None]  # [Q, C]
    inner = torch.block_diag(*[w.to(device=device, dtype=torch.uint8) for w in within]).bool()  # [Q, Q]
    return torch.cat([ctx, inner], dim=1)


def uniform_blocks_mask(anchors: Tensor, block_size: int, attention: str, ctx_len: int) -> Tensor:
    """Training/replay mask for equal-sized blocks: anchors [B, G] (block g sees context < anchors[b, g]).
    Returns [B, G*b, ctx_len + G*b] bool."""
    b, g = anchors.shape
    device = anchors.device
    pattern = block_pattern(block_size, attention, device)
    limit = anchors.repeat_interleave(block_size, dim=1)  # [B, G*b]
    ctx = torch.arange(ctx_len, device=device)[None, None, :] < limit[:, :, None]  # [B, Q, C]
    group = torch.arange(g, device=device).repeat_interleave(block_size)  # [Q]
    same = group[:, None] == group[None, :]
    inner = same & pattern.repeat(g, g)  # [Q, Q]
    return torch.cat([ctx, inner[None].expand(b, -1, -1)], dim=2)
