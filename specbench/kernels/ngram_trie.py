"""Prompt lookup's padded trie in one program: the `ngram` drafter's device drafting as one launch.

The same arrays as the drafter's tensor-op path (`specbench/drafters/ngram.py`, `lookup_trie`, itself tested
against plain loops; the kernel test compares the two), which on an H200 is ~86 small kernels a round
(0.22-0.24 ms of a 1.3-1.4 ms round, docs/measurements/README.md). One program, no host read:

  1. suffix match: for every window end e < length - 1, how many of the last max_ngram tokens match
     backwards from e; the longest such n (if >= min_ngram) and the max_matches most recent ends that reach
     it (two passes over the history, blocks from the end down; ranks by a cumulative sum)
  2. continuations [M, L]: the committed tokens after each matched end
  3. the trie: continuations i, j agree to depth l iff l < first mismatch(i, j); a prefix's node belongs to
     the first row that has it; node ids number the owned cells row-major (then the unowned cells after the
     real count), parents are the owners of depth l - 1, scores log(fraction of matches through the node)
     in float64.

Output: tokens, parents, depth [1 + M * L] int64, scores [1 + M * L] float64 (node 0 the root), count [1]
int64 (the real nodes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device

BLOCK_S = 512


@triton.jit
def _match_lengths(Hist, offs, length, S, tail, K, KP: tl.constexpr):
    """[BLOCK_S] int32: how many of the suffix tokens match backwards from each window end in offs."""
    alive = (offs < S) & (offs < length - 1)
    run = tl.zeros(offs.shape, dtype=tl.int32)
    for j in range(K):
        want = tl.sum(tl.where(tl.arange(0, KP) == j, tail, 0), 0)  # the suffix's j-th token from its end
        at = offs - j
        tok = tl.load(Hist + at, mask=alive & (at >= 0), other=-1)
        alive = alive & (at >= 0) & (tok == want)
        run += alive.to(tl.int32)
    return run


# The drafter's arguments (max_ngram K, min_ngram MIN_N, max_matches M, width L) are runtime values, unspecialized:
# only their power-of-two tiles are compile-time, so a sweep over the arguments compiles a handful of variants.
@triton.jit(do_not_specialize=["K", "MIN_N", "M", "L"])
def _ngram_trie_kernel(Hist, Len, Root, Tok, Par, Dep, Score, Count, S, K, MIN_N, M, L,
                       KP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK: tl.constexpr):
    length = tl.load(Len)
    kk = tl.arange(0, KP)
    tail = tl.load(Hist + tl.maximum(length - 1 - kk, 0))  # [KP] the suffix, from its end (first K used)

    # 1. the longest matched suffix, then its M most recent ends (ranked from the end of the history down)
    longest = 0
    for b in range(0, S, BLOCK):
        offs = b + tl.arange(0, BLOCK)
        longest = tl.maximum(longest, tl.max(_match_lengths(Hist, offs, length, S, tail, K, KP), 0))
    longest = tl.where(longest >= MIN_N, longest, 0)
    rows = tl.arange(0, BLOCK_M)  # [BM]
    starts = tl.full([BLOCK_M], -1, tl.int32)
    found = 0
    nblocks = tl.cdiv(S, BLOCK)
    for t in range(0, nblocks):
        offs = (nblocks - 1 - t) * BLOCK + tl.arange(0, BLOCK)
        qual = (_match_lengths(Hist, offs, length, S, tail, K, KP) >= longest) & (longest > 0) & (offs < S) \
            & (offs < length - 1)
        q = qual.to(tl.int32)
        rank = found + tl.sum(q, 0) - tl.cumsum(q, 0)  # [BLOCK] qualifying ends after this one, in all blocks so far
        hit = qual[None, :] & (rank[None, :] == rows[:, None])  # [BM, BLOCK]
        starts = tl.maximum(starts, tl.max(tl.where(hit, offs[None, :] + 1, -1), 1))
        found += tl.sum(q, 0)
    starts = tl.where(rows < M, starts, -1)

    # 2. continuations [BM, BL]
    cols = tl.arange(0, BLOCK_L)  # [BL]
    at = starts[:, None] + cols[None, :]
    ok = (starts[:, None] >= 0) & (at < length) & (cols[None, :] < L)  # [BM, BL]
    tab = tl.load(Hist + tl.maximum(at, 0), mask=ok, other=0)
    n_valid = tl.maximum(tl.sum(tl.sum(ok.to(tl.int32) * (cols[None, :] == 0), 1), 0), 1)  # matches at all

    # 3. first mismatch of every pair, then who owns each prefix
    mism = tl.zeros([BLOCK_M, BLOCK_M], dtype=tl.int32)  # [i, j]
    own = tl.zeros([BLOCK_M, BLOCK_L], dtype=tl.int32)  # [i, l] row i owns its prefix to depth l
    own_prev = tl.zeros([BLOCK_M, BLOCK_L], dtype=tl.int32)  # the same at depth l - 1
    count_same = tl.zeros([BLOCK_M, BLOCK_L], dtype=tl.int32)  # rows agreeing with row i to depth l
    for i in tl.static_range(BLOCK_M):
        sel = rows[:, None] == i
        tab_i = tl.sum(tl.where(sel, tab, 0), 0)  # [BL]
        ok_i = tl.sum(tl.where(sel, ok.to(tl.int32), 0), 0) != 0
        agree = (tab == tab_i[None, :]) & ok & ok_i[None, :]  # [BM (j), BL]
        first_off = tl.min(tl.where(agree, BLOCK_L, cols[None, :]), 1)  # [BM]: depth of the first mismatch
        mism = tl.where(sel, first_off[None, :], mism)
        reach = first_off[:, None] > cols[None, :]  # [j, l] rows j agree with i to depth l
        reach_prev = (first_off[:, None] > cols[None, :] - 1) & (cols[None, :] >= 1)
        earlier = rows[:, None] < i
        own_i = ok_i & (tl.sum((reach & earlier).to(tl.int32), 0) == 0)
        start_i = tl.sum(tl.where(rows == i, starts, 0), 0)
        prev_ok = (cols >= 1) & (cols - 1 < L) & (start_i >= 0) & (start_i + cols - 1 < length)  # ok_i[l - 1]
        own_prev_i = prev_ok & (tl.sum((reach_prev & earlier).to(tl.int32), 0) == 0)
        own = tl.where(sel, own_i[None, :].to(tl.int32), own)
        own_prev = tl.where(sel, own_prev_i[None, :].to(tl.int32), own_prev)
        count_same = tl.where(sel, tl.sum(reach.to(tl.int32), 0)[None, :], count_same)

    # node ids: owned cells numbered row-major 1..count, the other cells after them
    real = (rows[:, None] < M) & (cols[None, :] < L)
    free = real.to(tl.int32) - own
    row_own = tl.sum(own, 1)
    row_free = tl.sum(free, 1)
    own_off = tl.cumsum(row_own, 0) - row_own  # [BM] exclusive
    free_off = tl.cumsum(row_free, 0) - row_free
    count = tl.sum(row_own, 0)
    own_cum = tl.cumsum(own, 1)  # [BM, BL] inclusive along the row
    free_cum = tl.cumsum(free, 1)
    node = tl.where(own != 0, own_off[:, None] + own_cum, count + free_off[:, None] + free_cum)
    node_prev = tl.where(own_prev != 0, own_off[:, None] + own_cum - own,
                         count + free_off[:, None] + free_cum - free)  # the cell at depth l - 1 of the same row

    for i in tl.static_range(BLOCK_M):
        if i < M:
            sel = rows[:, None] == i
            mism_i = tl.sum(tl.where(sel, mism, 0), 0)  # [BM (j)]
            # the owner of row i's prefix at depth l - 1: the first row j agreeing to it
            reach_prev = (mism_i[:, None] > cols[None, :] - 1) & (rows[:, None] < M)
            first_j = tl.min(tl.where(reach_prev, rows[:, None], BLOCK_M), 0)  # [BL]
            first_j = tl.where(first_j == BLOCK_M, 0, first_j)
            parent = tl.sum(tl.where(rows[:, None] == first_j[None, :], node_prev, 0), 0)
            parent = tl.where(cols == 0, 0, parent)
            own_i = tl.sum(tl.where(sel, own, 0), 0) != 0
            node_i = tl.sum(tl.where(sel, node, 0), 0)
            tok_i = tl.sum(tl.where(sel, tab, 0), 0)
            frac = tl.sum(tl.where(sel, count_same, 0), 0).to(tl.float64) / n_valid.to(tl.float64)
            live = cols < L
            tl.store(Tok + node_i, tl.where(own_i, tok_i, 0).to(tl.int64), mask=live)
            tl.store(Par + node_i, tl.where(own_i, parent, -1).to(tl.int64), mask=live)
            tl.store(Dep + node_i, tl.where(own_i, cols + 1, 0).to(tl.int64), mask=live)
            tl.store(Score + node_i, tl.where(own_i, tl.log(tl.where(own_i, frac, 1.0)), float("-inf")), mask=live)
    tl.store(Tok, tl.load(Root))
    tl.store(Par, -1)
    tl.store(Dep, 0)
    tl.store(Score, 0.0)
    tl.store(Count, count.to(tl.int64))


def ngram_trie(history: Tensor, length: Tensor, root: Tensor, max_ngram: int, min_ngram: int, max_matches: int,
               size: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(tokens, parents, depth, scores, count) of the padded trie of history[:length] (see the module docstring).
    history [S] int64, length [1] int64, root [1] int64 (the anchor token), all on one device."""
    require_kernel_device(history)
    m, width = max_matches, size
    n = 1 + m * width
    dev = history.device
    tok = torch.empty(n, dtype=torch.long, device=dev)
    par, dep = torch.empty_like(tok), torch.empty_like(tok)
    score = torch.empty(n, dtype=torch.float64, device=dev)
    count = torch.empty(1, dtype=torch.long, device=dev)
    _ngram_trie_kernel[(1,)](history, length, root, tok, par, dep, score, count, history.shape[0],
                             max_ngram, min_ngram, m, width, KP=max(2, triton.next_power_of_2(max_ngram)),
                             BLOCK_M=max(2, triton.next_power_of_2(m)), BLOCK_L=max(2, triton.next_power_of_2(width)),
                             BLOCK=BLOCK_S, num_warps=4)
    return tok, par, dep, score, count
