"""A tree's ancestor mask in one launch: what the verify forward attends by, built from the parents.

The reference (`masks.ancestor_masks`, the CPU path) is pointer doubling in tensor ops: an eye, then log2(depth) rounds
of a row gather and an OR (about 15 kernels at depth 16, run in every verify forward of a tree round on a
launch-bound GPU). Here one program per tree walks every node up to the root at once:

  1. zero the [N, N] rows;
  2. cur[i] = i; while some cur[i] >= 0: mask[i, cur[i]] = 1; cur[i] = parent[cur[i]].

Same result as the reference for every valid tree within the reference's depth bound (parents[i] < i;
nodes other than the root with parent -1 are padding and see only themselves). The walk takes max depth
+ 1 steps and is bounded by N, so a malformed parent array cannot loop.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device

MAX_NODES = 1024
ZERO_TILE = 4096  # elements a zeroing store covers


@triton.jit
def _ancestor_mask_kernel(Par, Out, N, stride_pb, stride_ob, stride_on,
                          BLOCK: tl.constexpr, ROWS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    par_row, out = Par + b * stride_pb, Out + b * stride_ob
    i = tl.arange(0, BLOCK)
    valid = i < N
    r = tl.arange(0, ROWS)
    for r0 in range(0, N, ROWS):  # 1. zero the rows, ROWS at a time
        rows = r0 + r
        tl.store(out + rows[:, None] * stride_on + i[None, :], tl.zeros((ROWS, BLOCK), dtype=tl.int8),
                 mask=(rows < N)[:, None] & valid[None, :])
    tl.debug_barrier()  # the zeros land before the walk's ones (other threads store to the same rows)
    cur = tl.where(valid, i, -1)
    step = 0
    while (tl.max(cur, axis=0) >= 0) & (step <= N):  # 2. every node up to the root at once
        on = cur >= 0
        tl.store(out + i * stride_on + cur, tl.full((BLOCK,), 1, tl.int8), mask=on)
        cur = tl.where(on, tl.load(par_row + tl.where(on, cur, 0), mask=on, other=-1).to(tl.int32), -1)
        step += 1


def ancestor_mask(parents: Tensor) -> Tensor:
    """parents [..., N] int64 (-1: none) -> [..., N, N] bool: mask[..., i, j] = j is i or an ancestor of i."""
    require_kernel_device(parents)
    n = parents.shape[-1]
    if not 1 <= n <= MAX_NODES:
        raise ValueError(f"ancestor_mask takes 1..{MAX_NODES} nodes, got {n}")
    flat = parents.reshape(-1, n).contiguous()  # [B, N]
    out = torch.empty(flat.shape[0], n, n, dtype=torch.int8, device=parents.device)  # [B, N, N]
    block = triton.next_power_of_2(n)
    _ancestor_mask_kernel[(flat.shape[0],)](flat, out, n, flat.stride(0), out.stride(0), out.stride(1),
                                            BLOCK=block, ROWS=max(1, ZERO_TILE // block), num_warps=4)
    return out.view(torch.bool).reshape(*parents.shape, n)
