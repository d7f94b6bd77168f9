"""The `budget` best-scored nodes of a candidate tree, re-indexed, in one launch (what `select` does for a
drafter with its own scored candidates: prompt lookup's padded trie on the GPU round).

Reference: `trees.base.select_top_scores`' tensor ops (a stable sort of the scores, the kept ids sorted,
then the subtree's index arrays: about 12 kernels). One program holds every node (past ONE_PROGRAM_MAX_NODES,
step 1 runs first over programs of RANK_ROWS nodes, and one program does 2-3 in a second launch):

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
ONE_PROGRAM_MAX_NODES = 192
"""Up to here one program ranks and compacts (one launch); past it the rank is split over programs of RANK_ROWS
nodes and a second launch compacts. One program ranks all N nodes in tiles of next_pow2(N) rows, so its time grows
with N^2: in CUDA graphs on an H100 (scripts/bench_tree_ops.py, 2026-12-07) 4.9 / 6.0 / 16.8 / 24.0 / 62.2 us at
129 / 193 / 257 / 385 / 513 nodes, against 33.6-49.9 for the tensor ops. The two-launch split is untimed: the
benchmark times both at every size (eagle3's 711 candidates, prompt lookup's trie at budget 64: 513)."""
RANK_ROWS = 64  # nodes a program ranks in the two-launch path


@triton.jit
def _ranks(Sc, i, s, N, CHUNK: tl.constexpr):
    """rank[i] among the non-root nodes: #{j >= 1: s[j] > s[i], or s[j] == s[i] and j < i}, CHUNK columns at a time."""
    rank = tl.zeros(i.shape, dtype=tl.int32)
    for j0 in range(1, N, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        sj = tl.load(Sc + j, mask=j < N, other=0.0)  # [CHUNK]
        ahead = (sj[None, :] > s[:, None]) | ((sj[None, :] == s[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((ahead & (j < N)[None, :]).to(tl.int32), axis=1)
    return rank


@triton.jit
def _write_kept(Tok, Par, Dep, Scratch, OTok, OPar, ODep, OSc, i, valid, keep, s):
    """2-3 of the module docstring for the nodes `i` of one program holding every node: new[i] = #kept below i
    (a cumsum), then each kept node's arrays at new[i], its parent re-indexed."""
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


@triton.jit
def _select_top_kernel(Tok, Par, Dep, Sc, Scratch, OTok, OPar, ODep, OSc, N, BUDGET,
                       BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    valid = i < N
    s = tl.load(Sc + i, mask=valid, other=0.0)  # [BLOCK]
    rank = _ranks(Sc, i, s, N, CHUNK)  # 1.
    keep = valid & ((i == 0) | (rank < BUDGET))  # 2.
    _write_kept(Tok, Par, Dep, Scratch, OTok, OPar, ODep, OSc, i, valid, keep, s)


@triton.jit
def _rank_keep_kernel(Sc, Keep, N, BUDGET, ROWS: tl.constexpr, CHUNK: tl.constexpr):
    """1-2 for the ROWS nodes of this program: keep[i] (int32) = root, or rank < budget."""
    i = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    valid = i < N
    s = tl.load(Sc + i, mask=valid, other=0.0)  # [ROWS]
    rank = _ranks(Sc, i, s, N, CHUNK)
    tl.store(Keep + i, (valid & ((i == 0) | (rank < BUDGET))).to(tl.int32), mask=valid)


@triton.jit
def _compact_kernel(Tok, Par, Dep, Sc, Keep, Scratch, OTok, OPar, ODep, OSc, N, BLOCK: tl.constexpr):
    """2-3 in one program, from the keep flags of `_rank_keep_kernel`."""
    i = tl.arange(0, BLOCK)
    valid = i < N
    keep = valid & (tl.load(Keep + i, mask=valid, other=0) != 0)
    s = tl.load(Sc + i, mask=valid, other=0.0)
    _write_kept(Tok, Par, Dep, Scratch, OTok, OPar, ODep, OSc, i, valid, keep, s)


def select_top(tokens: Tensor, parents: Tensor, depth: Tensor, scores: Tensor, budget: int,
               one_program: bool | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """tokens, parents, depth [N] int64, scores [N] float32 of a tree with N - 1 > budget >= 0 -> the same
    arrays [budget + 1] of the root and the `budget` best-scored nodes (score descending, equal scores by
    lower id), in increasing original order, parents re-indexed. `one_program`: rank in the launch that
    compacts (default: up to ONE_PROGRAM_MAX_NODES nodes), else rank over programs of RANK_ROWS nodes first."""
    require_kernel_device(tokens)
    n = tokens.shape[0]
    if not 1 <= n <= MAX_NODES or not 0 <= budget < n - 1:
        raise ValueError(f"select_top takes 1..{MAX_NODES} nodes and a budget below N - 1; got N = {n}, budget {budget}")
    tokens, parents, depth, scores = (t.contiguous() for t in (tokens, parents, depth, scores))
    block = max(16, triton.next_power_of_2(n))
    scratch = torch.empty(block, dtype=torch.int32, device=tokens.device)
    out = [torch.empty(budget + 1, dtype=t.dtype, device=t.device) for t in (tokens, parents, depth, scores)]
    warps = 4 if block <= 256 else 8
    if one_program is None:
        one_program = n <= ONE_PROGRAM_MAX_NODES
    if one_program:
        _select_top_kernel[(1,)](tokens, parents, depth, scores, scratch, *out, n, budget,
                                 BLOCK=block, CHUNK=max(16, min(block, 8192 // block)), num_warps=warps)
        return out[0], out[1], out[2], out[3]
    keep = torch.empty(n, dtype=torch.int32, device=tokens.device)
    _rank_keep_kernel[(triton.cdiv(n, RANK_ROWS),)](scores, keep, n, budget, ROWS=RANK_ROWS, CHUNK=128, num_warps=4)
    _compact_kernel[(1,)](tokens, parents, depth, scores, keep, scratch, *out, n, BLOCK=block, num_warps=warps)
    return out[0], out[1], out[2], out[3]
