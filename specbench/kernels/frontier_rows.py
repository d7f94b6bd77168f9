"""A tree drafter's per-depth frontier bookkeeping in one launch (eagle3's `draft_logp`).

Before each head pass over a depth's F frontier nodes, a drafter that keeps one draft-cache row per
expanded node needs, for every frontier node, its token and its parent's row, and afterwards records the
rows it gave the frontier (first .. first + F - 1): `node_rows[parents[frontier]]`, `tokens[frontier]` and
`node_rows[frontier] = rows`, four gathers and scatters of a few dozen entries, each a ~3-5 us graph node on
the GPU round (seven depths a round under EAGLE-2's defaults). One program does all three. The parents are
earlier nodes than the frontier, so the rows it reads are never the ones it writes.
Reference: `drafters.eagle3.drafter.frontier_rows_ops`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device

MAX_FRONTIER = 4096  # nodes one program holds


@triton.jit
def _frontier_rows_kernel(Frontier, Parents, Tokens, NodeRows, ParentRows, OutTokens, F, FIRST, stride_frontier,
                          F_PAD: tl.constexpr):
    i = tl.arange(0, F_PAD)
    ok = i < F
    node = tl.load(Frontier + i * stride_frontier, mask=ok, other=0)
    parent_row = tl.load(NodeRows + tl.load(Parents + node, mask=ok, other=0), mask=ok, other=0)
    tl.store(ParentRows + i, parent_row, mask=ok)
    tl.store(OutTokens + i, tl.load(Tokens + node, mask=ok, other=0), mask=ok)
    tl.store(NodeRows + node, (FIRST + i).to(tl.int64), mask=ok)


def frontier_rows(frontier: Tensor, parents: Tensor, tokens: Tensor, node_rows: Tensor, first: int) -> tuple[Tensor, Tensor]:
    """frontier [F] node ids (int64) of a tree with parents, tokens [N] (int64): returns (the rows of their
    parents, node_rows[parents[frontier]] [F]; their tokens [F]) and writes node_rows[frontier] =
    first .. first + F - 1 (node_rows [R] int64, the drafter's node -> row table)."""
    require_kernel_device(frontier)
    f = frontier.numel()
    if not 1 <= f <= MAX_FRONTIER:
        raise ValueError(f"frontier_rows takes 1..{MAX_FRONTIER} frontier nodes, got {f}")
    if parents.shape != tokens.shape or frontier.dim() != 1 or node_rows.dim() != 1:
        raise ValueError(f"frontier_rows: frontier {tuple(frontier.shape)}, parents {tuple(parents.shape)}, tokens "
                         f"{tuple(tokens.shape)}, node_rows {tuple(node_rows.shape)}")
    parents, tokens = parents.contiguous(), tokens.contiguous()  # (the frontier may be a strided view: read in place)
    parent_rows = torch.empty(f, dtype=node_rows.dtype, device=frontier.device)
    out_tokens = torch.empty(f, dtype=tokens.dtype, device=frontier.device)
    _frontier_rows_kernel[(1,)](frontier, parents, tokens, node_rows, parent_rows, out_tokens, f, first,
                                frontier.stride(0), F_PAD=max(2, triton.next_power_of_2(f)), num_warps=1 if f <= 128 else 4)
    return parent_rows, out_tokens
