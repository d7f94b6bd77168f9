"""The ranked top-k of wide rows (a draft distribution over the whole vocabulary) in two Triton launches.

Every tree builder ranks a depth's tokens by (log-prob desc, token id asc) (`specbench.trees.ranking`).
On CUDA the packed-key path (`trees.ranking.ranked_topk_keys`: float bits and complemented id in one
int64, then `torch.topk`) is a multi-pass radix select over 64-bit keys plus the key-building ops: the
tree stage that ran it over a [15, 49,152] table took 0.22 ms of a 1.57 ms dflash/ddtree/64 round on
the H200. Here the same keys are built and ranked on chip:

  chunk pass  [R, NC] programs: each builds the keys of CH entries of its row and keeps its best KP
              (KP = k rounded up to a power of two) in a scratch row [R, NC * KP]
  merge pass  the best KP of those candidates, repeated while a row has more than MERGE_MAX of them;
              the last one writes the k best ids and their values (read back from the input row)

A row that one program holds whole (up to ONE_PASS_MAX entries) is ranked in one launch: the chunk pass writes
the ids and values itself. eagle3's 4,096-token draft rows are faster in chunks of 1,024 and a merge (H100, in a
CUDA graph: 6.2-6.5 us against 10.7-10.8 us for one program a row, k = 10-16; `scripts/bench_ranked_topk.py`),
full-vocabulary rows in chunks of 2,048 (H200: 37.2 us against 41.7 for 1,024 at 15 x 49,152, k = 64).

The keys are unique per id, so "the k largest keys" is one well-defined set in one order: the result
equals the reference exactly, ties included (tests compare both on rows with many equal values).
Inputs: x [R, V] float32/bf16/fp16 (any row stride, unit column stride), k <= V. Shapes depend only on
(R, V, k): the launches can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device
from specbench.kernels.top_b_tree import _best, _order_key

CHUNK = 2048  # entries of a row per program in the chunk pass (rows wider than NARROW_MAX)
NARROW_MAX, NARROW_CHUNK = 4096, 1024  # rows up to NARROW_MAX wide (a draft vocabulary): chunks of NARROW_CHUNK
MERGE_MAX = 4096  # candidates one program ranks in a merge pass
ONE_PASS_MAX = 1024  # rows up to this wide: one program a row, one launch (the default chunk)


@triton.jit
def _excluded(x, row, cols, ExclRows, ExclCols, NE):
    """x with the entries (row, cols[i]) that one of the NE pairs (ExclRows[j], ExclCols[j]) names set to -inf."""
    for j in range(0, NE):
        hit = (tl.load(ExclRows + j) == row) & (cols == tl.load(ExclCols + j))
        x = tl.where(hit, float("-inf"), x)
    return x


@triton.jit
def _write_ranked(best, X, OutVal, OutIdx, IdMap, row, K, stride_x, HAS_MAP: tl.constexpr,
                  ExclRows, ExclCols, NE, HAS_EXCL: tl.constexpr):
    """The k best of `best` (keys, descending) as ids (the complemented low half back; through IdMap where
    HAS_MAP) and their values read from the input row (as stored; -inf where HAS_EXCL excludes them)."""
    j = tl.arange(0, best.shape[0])
    idx = 0xFFFFFFFF - (best & 0xFFFFFFFF)
    take = j < K
    val = tl.load(X + row * stride_x + idx, mask=take, other=0.0).to(tl.float32)
    if HAS_EXCL:
        val = _excluded(val, row, idx, ExclRows, ExclCols, NE)
    if HAS_MAP:
        tl.store(OutIdx + row * K + j, tl.load(IdMap + idx, mask=take, other=0), mask=take)
    else:
        tl.store(OutIdx + row * K + j, idx, mask=take)
    tl.store(OutVal + row * K + j, val, mask=take)


@triton.jit
def _chunk_kernel(X, Cand, OutVal, OutIdx, IdMap, ExclRows, ExclCols, NE, V, K, stride_x, NC, CH: tl.constexpr,
                  KP: tl.constexpr, USE_TOPK: tl.constexpr, FINAL: tl.constexpr, HAS_MAP: tl.constexpr,
                  HAS_EXCL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * CH + tl.arange(0, CH)
    ok = offs < V
    x = tl.load(X + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_EXCL:  # the excluded entries rank as -inf, by id like any other
        x = _excluded(x, row, offs, ExclRows, ExclCols, NE)
    keys = tl.where(ok, _order_key(x, offs), tl.full([CH], -9223372036854775808, tl.int64))  # [CH]
    best = _best(keys, KP, USE_TOPK)
    if FINAL:  # the whole row in this one program (NC == 1): the result directly
        _write_ranked(best, X, OutVal, OutIdx, IdMap, row, K, stride_x, HAS_MAP, ExclRows, ExclCols, NE, HAS_EXCL)
    else:
        j = tl.arange(0, best.shape[0])
        tl.store(Cand + (row * NC + chunk) * KP + j, best, mask=j < KP)


@triton.jit
def _merge_kernel(Cand, Out, X, OutVal, OutIdx, IdMap, ExclRows, ExclCols, NE, M, NC_OUT, K, stride_x,
                  CH: tl.constexpr, KP: tl.constexpr, FINAL: tl.constexpr, USE_TOPK: tl.constexpr, HAS_MAP: tl.constexpr,
                  HAS_EXCL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * CH + tl.arange(0, CH)
    keys = tl.load(Cand + row * M + offs, mask=offs < M, other=-9223372036854775808)  # [CH]
    best = _best(keys, KP, USE_TOPK)
    j = tl.arange(0, best.shape[0])
    if FINAL:
        _write_ranked(best, X, OutVal, OutIdx, IdMap, row, K, stride_x, HAS_MAP, ExclRows, ExclCols, NE, HAS_EXCL)
    else:
        tl.store(Out + (row * NC_OUT + chunk) * KP + j, best, mask=j < KP)


def ranked_topk_triton(x: Tensor, k: int, chunk: int | None = None, use_topk: bool | None = None,
                       merge_max: int = MERGE_MAX, id_map: Tensor | None = None,
                       exclude: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """(values [R, k] float32, ids [R, k] int64): the k best entries of each row of x [R, V] by (value desc,
    id asc), -0.0 ranked as +0.0 (values come back as stored); `id_map` [V] (int64): the ids come back as
    id_map[ids], in the same launch (eagle3's draft -> target vocabulary); `exclude` (rows [J], cols [J], int64):
    the entries x[rows[j], cols[j]] rank as -inf (a negative row matches none), as if written there first
    (jetspec-tree's re-selection: a node's existing children). `chunk`: entries per program of the chunk
    pass (a power of two >= the padded k; default: the whole row up to ONE_PASS_MAX, NARROW_CHUNK up to NARROW_MAX, else CHUNK); a row in
    one chunk is ranked in one launch. `use_topk`: rank with `tl.topk` (default: where Triton has it)
    instead of a full `tl.sort`; `merge_max`: candidates per program of a merge pass (a power of two)."""
    require_kernel_device(x)
    if x.dim() != 2 or x.shape[-1] < 1 or not x.is_floating_point():
        raise ValueError(f"ranked_topk_triton expects a float [rows, vocab] tensor, got {x.dtype} {tuple(x.shape)}")
    rows, vocab = x.shape
    k = int(k)
    if not 1 <= k <= vocab:
        raise ValueError(f"k must be in [1, {vocab}], got {k}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    kp = max(2, triton.next_power_of_2(k))  # tl.topk needs a power of two (and >= 2 on older Triton)
    if chunk is None:
        chunk = (triton.next_power_of_2(vocab) if vocab <= ONE_PASS_MAX else NARROW_CHUNK if vocab <= NARROW_MAX
                 else CHUNK)
    ch = max(chunk, kp)
    merge = max(merge_max, 2 * kp)  # a merge pass must shrink its rows
    if ch & (ch - 1) or merge & (merge - 1):
        raise ValueError(f"chunk and merge_max must be powers of two, got {chunk}, {merge_max}")
    topk = hasattr(tl, "topk") if use_topk is None else use_topk
    dev = x.device
    has_map = id_map is not None
    if has_map and (id_map.shape != (vocab,) or id_map.dtype != torch.int64 or id_map.device != dev):  # type: ignore[union-attr]
        raise ValueError(f"id_map must be an int64 [{vocab}] tensor on {dev}, got {id_map.dtype} "  # type: ignore[union-attr]
                         f"{tuple(id_map.shape)} on {id_map.device}")  # type: ignore[union-attr]
    id_map = id_map.contiguous() if has_map else x  # type: ignore[union-attr]  # (a pointer the kernel never reads)
    has_excl = exclude is not None
    if has_excl:
        excl_rows, excl_cols = (t.contiguous() for t in exclude)  # type: ignore[union-attr]
        if (excl_rows.shape != excl_cols.shape or excl_rows.dim() != 1 or excl_rows.dtype != torch.int64
                or excl_cols.dtype != torch.int64 or excl_rows.device != dev):
            raise ValueError(f"exclude must be two int64 [J] tensors on {dev}, got {excl_rows.dtype} "
                             f"{tuple(excl_rows.shape)} and {excl_cols.dtype} {tuple(excl_cols.shape)}")
    else:
        excl_rows = excl_cols = x  # (pointers the kernel never reads)
    ne = excl_rows.numel() if has_excl else 0
    extra = dict(HAS_MAP=has_map, HAS_EXCL=has_excl)
    vals = torch.empty(rows, k, dtype=torch.float32, device=dev)
    ids = torch.empty(rows, k, dtype=torch.int64, device=dev)
    nc = triton.cdiv(vocab, ch)
    warps = 4 if ch <= 2048 else 8
    if nc == 1:  # one program a row: ranked in this launch
        _chunk_kernel[(rows, 1)](x, ids, vals, ids, id_map, excl_rows, excl_cols, ne, vocab, k, x.stride(0), 1, CH=ch,
                                 KP=kp, USE_TOPK=topk, FINAL=True, **extra, num_warps=warps)
        return vals, ids
    cand = torch.empty(rows, nc * kp, dtype=torch.int64, device=dev)
    _chunk_kernel[(rows, nc)](x, cand, vals, ids, id_map, excl_rows, excl_cols, ne, vocab, k, x.stride(0), nc, CH=ch,
                              KP=kp, USE_TOPK=topk, FINAL=False, **extra, num_warps=warps)
    m = nc * kp
    while m > merge:  # another round of chunks over the candidates
        nc_out = triton.cdiv(m, merge)
        out = torch.empty(rows, nc_out * kp, dtype=torch.int64, device=dev)
        _merge_kernel[(rows, nc_out)](cand, out, x, vals, ids, id_map, excl_rows, excl_cols, ne, m, nc_out, k,
                                      x.stride(0), CH=merge, KP=kp, FINAL=False, USE_TOPK=topk, **extra,
                                      num_warps=4 if merge <= 2048 else 8)
        cand, m = out, nc_out * kp
    mp = max(kp, triton.next_power_of_2(m))
    _merge_kernel[(rows, 1)](cand, cand, x, vals, ids, id_map, excl_rows, excl_cols, ne, m, 1, k, x.stride(0), CH=mp,
                             KP=kp, FINAL=True, USE_TOPK=topk, **extra, num_warps=4 if mp <= 2048 else 8)
    return vals, ids
