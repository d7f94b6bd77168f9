"""The `budget` best-scored nodes of a candidate tree, re-indexed, in one launch (what `select` does for a
drafter with its own scored candidates: prompt lookup's padded trie on the GPU round).

Reference: `trees.base.select_top_scores`' tensor ops (a stable sort of the scores, the kept ids sorted,
then the subtree's index arrays: about 12 kernels). One program holds every node:

  1. rank[i] = #{j >= 1: s[j] > s[i], or s[j] == s[i] and j < i}   (the stable descending sort's position)
  2. keep = root, and the nodes of rank < budget; new[i] = #kept ids below i (a cumsum)
  3. each kept node writes its token, depth, score and new[parent] at new[i].

The kept set is closed under parents when scores never rise from parent to child (ties: the parent's lower
id ranks first), as the contract of `TreePolicy.select` requires. Scores are not NaN (log-probs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device

MAX_NODES = 1024
FASTER_MAX_NODES = 512
"""Where `select_top_scores` takes the kernel on CUDA. One program ranks all N nodes in tiles of next_pow2(N) rows,
so its time grows with N^2 while the tensor ops' barely grows: in CUDA graphs on an H100 (scripts/bench_tree_ops.py,
2026-12-07) 4.9 / 6.0 / 16.8 / 24.0 against 33.6 / 45.3 / 49.7 / 49.8 us at 129 / 193 / 257 / 385 nodes (prompt
lookup's trie at budgets 16-48), but 62.2 against 49.9 at 513 (budget 64: the row tile doubles to 1,024)."""


@triton.jit
def _select_top_kernel(Tok, Par, Dep, Sc, Scratch, OTok, OPar, ODep, OSc, N, BUDGET,
                       BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    valid = i < N
    s = tl.load(Sc + i, mask=valid, other=0.0)  # [BLOCK]
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    for j0 in range(1, N, CHUNK):  # 1. rank among the non-root nodes, CHUNK columns at a time
        j = j0 + tl.arange(0, CHUNK)
        sj = tl.load(Sc + j, mask=j < N, other=0.0)  # [CHUNK]
        ahead = (sj[None, :] > s[:, None]) | ((sj[None, :] == s[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((ahead & (j < N)[None, :]).to(tl.int32), axis=1)
    keep = valid & ((i == 0) | (rank < BUDGET))  # 2.
    new = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    tl.store(Scratch + i, new, mask=valid)
    tl.debug_barrier()  # every new index is stored before the parents' are read (other threads' nodes)
    par = tl.load(Par + i, mask=valid, other=-1)
    has_par = keep & (par >= 0)
    new_par = tl.load(Scratch + tl.where(has_par, par, 0), mask=has_par, other=-1, volatile=True)
    tl.store(OTok + new, tl.load(Tok + i, mask=keep), mask=keep)  # 3.
    tl.store(OPar + new, new_par.to(tl.int64), mask=keep)
    tl.store(ODep + new, tl.load(Dep + i, mask=keep), mask=keep)
    tl.store(OSc + new, s, mask=keep)


def select_top(tokens: Tensor, parents: Tensor, depth: Tensor, scores: Tensor, budget: int
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """tokens, parents, depth [N] int64, scores [N] float32 of a tree with N - 1 > budget >= 0 -> the same
    arrays [budget + 1] of the root and the `budget` best-scored nodes (score descending, equal scores by
    lower id), in increasing original order, parents re-indexed."""
    require_kernel_device(tokens)
    n = tokens.shape[0]
    if not 1 <= n <= MAX_NODES or not 0 <= budget < n - 1:
        raise ValueError(f"select_top takes 1..{MAX_NODES} nodes and a budget below N - 1; got N = {n}, budget {budget}")
    tokens, parents, depth, scores = (t.contiguous() for t in (tokens, parents, depth, scores))
    block = max(16, triton.next_power_of_2(n))
    scratch = torch.empty(block, dtype=torch.int32, device=tokens.device)
    out = [torch.empty(budget + 1, dtype=t.dtype, device=t.device) for t in (tokens, parents, depth, scores)]
    _select_top_kernel[(1,)](tokens, parents, depth, scores, scratch, *out, n, budget,
                             BLOCK=block, CHUNK=max(16, min(block, 8192 // block)), num_warps=4 if block <= 256 else 8)
    return out[0], out[1], out[2], out[3]
