"""jetspec-tree's re-selection input in two launches: the candidate tree rescored by the path-conditioned
log-probs of its second pass and extended by each node's best fresh children.

In tensor ops this is ~25 small kernels a round (the path sums, a copy of the [N, V] rows to mask the
existing children, a ranked top-k, and the concatenations of tokens, parents, depths, scores and the
grown ancestor mask), a tree stage of ~0.18 ms against dflash's 0.08 on the H100. Here:

  ranked top-k  `ranked_topk_triton(node_logp, extend, exclude=(parents, tokens))`: each node's `extend`
                best tokens with its existing children ranked as -inf, without copying the rows
  assembly      one program per candidate: its path sum (float64, over its ancestor-mask row), its own
                entry and its `extend` new leaves (node, rank order, after the candidates), and their rows
                of the grown ancestor mask [N(1+e), N(1+e)]

Reference: `drafters.heads.jetspec_tree.rescore_tree_ops` (equal tokens, parents, depths and mask; the
scores equal where the float64 path sums are exact, as they are for fp32 log-probs within 2**29 of each
other in magnitude, and otherwise within an ulp: the reference sums by a matrix product).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device
from specbench.kernels.ranked_topk import ranked_topk_triton


@triton.jit
def _assemble_kernel(Tokens, Parents, Depth, Mask, NodeLogp, ExtLp, ExtTok, OutTokens, OutParents, OutDepth,
                     OutScores, OutMask, N, E, MAX_DEPTH, stride_logp, N_PAD: tl.constexpr, M_PAD: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    m_total = N * (1 + E)
    j = tl.arange(0, N_PAD)
    j_ok = j < N
    parent = tl.load(Parents + j, mask=j_ok, other=-1)
    token = tl.load(Tokens + j, mask=j_ok, other=0)
    has_parent = j_ok & (parent >= 0)
    picked = tl.load(NodeLogp + tl.maximum(parent, 0) * stride_logp + token, mask=has_parent, other=0.0)
    contrib = tl.where(has_parent, picked.to(tl.float64), 0.0)  # [N_PAD] log q(token | parent's path)
    ancestors = tl.load(Mask + i * N + j, mask=j_ok, other=0)  # [N_PAD] uint8: row i of the ancestor mask
    score = tl.sum(tl.where(ancestors != 0, contrib, 0.0), 0)  # float64 path sum
    depth = tl.load(Depth + i)
    tl.store(OutTokens + i, tl.load(Tokens + i))
    tl.store(OutParents + i, tl.load(Parents + i))
    tl.store(OutDepth + i, depth)
    tl.store(OutScores + i, score)
    c = tl.arange(0, M_PAD)
    new_cols = N + c  # columns of the new leaves
    tl.store(OutMask + i * m_total + j, ancestors, mask=j_ok)
    tl.store(OutMask + i * m_total + new_cols, tl.zeros([M_PAD], tl.uint8), mask=new_cols < m_total)
    for r in range(0, E):  # the new leaves of node i: rows N + i*E + r
        row = N + i * E + r
        lp = tl.load(ExtLp + i * E + r).to(tl.float64)
        tl.store(OutTokens + row, tl.load(ExtTok + i * E + r))
        tl.store(OutParents + row, i)
        tl.store(OutDepth + row, depth + 1)
        tl.store(OutScores + row, tl.where(depth < MAX_DEPTH, score + lp, float("-inf")))
        tl.store(OutMask + row * m_total + j, ancestors, mask=j_ok)
        tl.store(OutMask + row * m_total + new_cols, (new_cols == row).to(tl.uint8), mask=new_cols < m_total)


def rescore_tree(tokens: Tensor, parents: Tensor, depth: Tensor, mask: Tensor, node_logp: Tensor, extend: int,
                 max_depth: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """A candidate tree (tokens, parents, depth [N] int64; ancestor mask [N, N] bool) and its second pass's
    node_logp [N, V]: (tokens, parents, depth [M] int64, scores [M] float64, ancestor mask [M, M] bool),
    M = N * (1 + extend), as `drafters.heads.jetspec_tree.rescore_tree_ops` returns them."""
    require_kernel_device(node_logp)
    n = tokens.numel()
    if node_logp.dim() != 2 or node_logp.shape[0] != n or mask.shape != (n, n) or parents.shape != (n,) or depth.shape != (n,):
        raise ValueError(f"rescore_tree: tokens {tuple(tokens.shape)}, parents {tuple(parents.shape)}, depth "
                         f"{tuple(depth.shape)}, mask {tuple(mask.shape)}, node_logp {tuple(node_logp.shape)}")
    if extend < 0 or extend > node_logp.shape[1]:
        raise ValueError(f"rescore_tree: extend must be in [0, {node_logp.shape[1]}], got {extend}")
    tokens, parents, depth = tokens.contiguous(), parents.contiguous(), depth.contiguous()
    node_logp = node_logp if node_logp.stride(-1) == 1 else node_logp.contiguous()
    dev = node_logp.device
    if extend > 0:  # each node's best fresh tokens: its existing children (parents[j], tokens[j]) rank as -inf
        ext_lp, ext_tok = ranked_topk_triton(node_logp, extend, exclude=(parents, tokens))
    else:
        ext_lp = ext_tok = torch.empty(0, device=dev)  # (never read)
    m = n * (1 + extend)
    out = (torch.empty(m, dtype=tokens.dtype, device=dev), torch.empty(m, dtype=parents.dtype, device=dev),
           torch.empty(m, dtype=depth.dtype, device=dev), torch.empty(m, dtype=torch.float64, device=dev))
    grown = torch.empty(m, m, dtype=torch.bool, device=dev)
    _assemble_kernel[(n,)](tokens, parents, depth, mask.contiguous().view(torch.uint8), node_logp, ext_lp, ext_tok,
                           *out, grown.view(torch.uint8), n, extend, max_depth, node_logp.stride(0),
                           N_PAD=max(2, triton.next_power_of_2(n)), M_PAD=max(2, triton.next_power_of_2(m - n)),
                           num_warps=1 if m <= 512 else 4)
    return (*out, grown)
