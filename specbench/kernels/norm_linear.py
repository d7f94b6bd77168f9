"""The element-wise op fused into the matrix product after it, for the few rows of decode and tree verify.

A decode step of a small target is launch-bound: per layer, add+RMSNorm -> wqkv, add+RMSNorm -> gate/up
-> SiLU*up -> down are seven kernels of a few microseconds each, mostly launch and tail. With M = B*N
rows (1 .. ~130) the element-wise work is free inside the product:

- add+RMSNorm before a product (`add_rmsnorm_linear`): RMSNorm(x) * w_n @ W.T = (x * w_n) @ W.T / rms(x),
  so one pass over K multiplies the A tiles (x + delta) * w_n and accumulates the rows' sums of squares
  beside the product; the row scale is applied to the fp32 accumulator at the end. The normed
  activations never go through memory, and there is no second pass for the statistics.
- the MLP (`add_rmsnorm_mlp`): the gate and the up rows of the program's slice in two accumulators,
  SiLU*up as the epilogue, so the [M, 2I] gate/up output is never written; then the down product. The
  norm runs before it in its own kernel (A tiles are plain loads), or, timed as an option, as the same
  prologue as above.
- SiLU*up before the down product (`silu_mul_linear`) as the prologue of its A tiles (used for one row).

The row tile BLOCK_M (16 .. 128) covers M in one or two tiles, so each program reads its BLOCK_N x K
weight slice once; row tiles of one slice are neighbouring programs.

Measured on an H200 (2026-12-03, docs/measurements/README.md): at 17 and 65 rows these row kernels lose to the
element-wise kernel + cuBLAS (SmolLM2's wqkv 9.1 vs 5.2 us, its MLP block 20.4 vs 12.1 us at 65 rows), while the
same kernel without its prologue ties cuBLAS: the element-wise work on the A tile is what costs. `FasterPerShape`
keeps the unfused path wherever they lose; the one-row matrix-vector kernels win (the decode step). The MLP block
with the norm in its own kernel and only SiLU*up fused (the epilogue, plain A loads) won at 65 rows in the next
measurement (11.0-11.7 us against 12.0-12.9 for the unfused block, SmolLM2 shapes, three runs of two holds).

Rounding: the residual add in the stream's dtype as the reference does; the A tile (x + delta) * w_n
rounded to the dtype (the reference rounds the normed x, then its product with w_n: one rounding less
here, and the scale after the product); the product accumulates in fp32 (tl.dot in IEEE fp32 for fp32
inputs, not TF32), adds the bias in fp32 and rounds once; gate and up rounded to the dtype before
silu(gate) (cast) * up (cast), as the unfused product's output is. So fp32 agrees with the reference
to rounding order, bf16 to about one rounding of the operands.

One row (a decode step, a draft head's single row) takes a matrix-vector kernel instead (`_gemv_kernel`):
no tl.dot tile of 16 rows of which 15 are padding, each program a few output columns (many programs, so
a memory-bound weight read spreads over the whole GPU) and the row's prologue (RMS statistics, or
SiLU*up) recomputed per program from the K-vector, which is tiny next to its BLOCK_N x K weight slice.
Its rounding is the reference's (normed x cast, times w_n, cast); the fp32 sum runs along each program's
columns in BLOCK_K strips.

Tile sizes come from `triton.autotune` per (row bucket, N, K, dtypes): autotuning benchmarks, so a new
key must first be seen outside CUDA-graph capture (`specbench.kernels.per_shape.FasterPerShape` does
that, and falls back to the composition for a key first seen during capture). The fallbacks
`add_rmsnorm_then_linear` / `add_rmsnorm_mlp_then_linear` / `silu_mul_then_linear` are the element-wise
kernels + cuBLAS.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor
from triton.testing import do_bench

from specbench.kernels.device import autotune_kept, interpreting, require_kernel_device
from specbench.kernels.fused import _row_rstd, rmsnorm, silu_mul

MAX_ROWS = 128  # beyond this (prefill) the product is compute-bound: cuBLAS with the element-wise kernel
ROW_TILES = ((16, 128, 4), (32, 64, 4), (32, 128, 3), (64, 64, 3))  # (BLOCK_N, BLOCK_K, stages) of the row kernels


def row_configs(block_ms: tuple[int, ...] = (16, 32, 64, 128), tiles=ROW_TILES) -> list[triton.Config]:
    """The row kernels' configs: every row tile BLOCK_M (the pruner keeps the one or two that cover M) times
    narrow N slices (many programs for a memory-bound weight read) and long K strips; 8 warps once the
    fp32 accumulator passes 4K values (the gate/up kernel holds two)."""
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=4 if bm * bn <= 4096 else 8,
                          num_stages=st) for bm in block_ms for bn, bk, st in tiles]


_INTERPRETER_CONFIG = triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32}, num_warps=4)  # loops over M, N, K
_ROW_CONFIGS = row_configs()


_GEMV_INTERPRETER_CONFIG = triton.Config({"BLOCK_N": 8, "BLOCK_K": 32}, num_warps=4)
_GEMV_CONFIGS = [  # one row: BLOCK_N x BLOCK_K fp32 partial sums in registers (<= 8K per program); the 8-warp
    # long strips keep more bytes in flight per program for wide-K, narrow-N products (Qwen3-8B's down
    # projection, N = 4,096 over K = 12,288, read at 72 % of the bandwidth by the 4-warp configs and cuBLAS)
    triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=st)
    for n, k, w, st in [(4, 512, 4, 3), (8, 256, 4, 4), (16, 256, 4, 4), (32, 128, 4, 4), (64, 128, 8, 3),
                        (8, 512, 8, 3), (16, 512, 8, 3), (4, 1024, 8, 2)]
]


def _pruner(interpreter_config: triton.Config, min_n: int, min_k: int):  # type: ignore[no-untyped-def]
    """Autotune's config filter: under the interpreter its one small config; else the configs whose blocks
    do not exceed N and K (rounded up to powers of two, at least min_n / min_k); only the smallest of them under
    SPECBENCH_AUTOTUNE=first (correctness runs)."""
    def prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
        if interpreting():
            return [interpreter_config]
        n, k = named_args["N"], named_args["K"]
        kept = [c for c in configs if c.kwargs["BLOCK_N"] <= max(min_n, triton.next_power_of_2(n))
                and c.kwargs["BLOCK_K"] <= max(min_k, triton.next_power_of_2(k))]
        kept = kept or configs[:1]
        return autotune_kept(kept)
    return prune


def covering_row_tiles(configs: list[triton.Config], m_bucket: int) -> list[triton.Config]:
    """The configs whose row tile BLOCK_M covers M in one or two tiles (m_bucket = M rounded up to a power of
    two, at least 16; at most two tiles of 128 rows)."""
    one = min(m_bucket, 128)
    return [c for c in configs if c.kwargs["BLOCK_M"] in (one, max(16, one // 2))]


def _prune_rows(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The row kernels' filter: the row tiles that cover M (`covering_row_tiles`), then `_pruner`'s."""
    return _pruner(_INTERPRETER_CONFIG, 16, 16)(covering_row_tiles(configs, named_args["M_BUCKET"]) or configs,
                                                named_args, **kwargs)


_prune_gemv = _pruner(_GEMV_INTERPRETER_CONFIG, 4, 128)


def _autotuned(fn, configs: list[triton.Config], key: tuple[str, ...], prune):
    return triton.autotune(
        configs=configs, key=list(key), prune_configs_by={"early_config_prune": prune},
        do_bench=lambda call, quantiles: do_bench(call, warmup=5, rep=20, quantiles=quantiles),  # ms, not the default 125
    )(fn)


def _rows_autotuned(fn):
    return _autotuned(fn, _ROW_CONFIGS, ("M_BUCKET", "N", "K"), _prune_rows)


@triton.jit
def _program_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(rows [BLOCK_M], cols [BLOCK_N], their bounds masks, the column tile's index) of this program of a row
    kernel's grid: the row tiles of one weight slice are neighbouring programs."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m, pid_n = pid % num_m, pid // num_m
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    return rows, cols, rows < M, cols < N, pid_n


@triton.jit
def _resid_tile(X, Delta, rows, ks, ok, stride_x, stride_d, HAS_DELTA: tl.constexpr):
    """[BLOCK_M, BLOCK_K] of the residual stream x + delta, rounded to the stream's dtype as `x + delta` is."""
    x = tl.load(X + rows[:, None] * stride_x + ks[None, :], mask=ok, other=0.0)
    if HAS_DELTA:
        d = tl.load(Delta + rows[:, None] * stride_d + ks[None, :], mask=ok, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _scaled_stream_tile(X, Delta, NormW, Resid, rows, ks, k_ok, ok, write_resid, stride_x, stride_d, stride_r,
                        HAS_DELTA: tl.constexpr):
    """(x * norm_w in fp32 [BLOCK_M, BLOCK_K], its rows' sums of squares [BLOCK_M]) of the stream tile x =
    x + delta; the program that `write_resid` stores the stream tile (one column slice does)."""
    x = _resid_tile(X, Delta, rows, ks, ok, stride_x, stride_d, HAS_DELTA)
    if HAS_DELTA:
        if write_resid:
            tl.store(Resid + rows[:, None] * stride_r + ks[None, :], x, mask=ok)
    xf = x.to(tl.float32)
    nw = tl.load(NormW + ks, mask=k_ok, other=0.0).to(tl.float32)
    return xf * nw[None, :], tl.sum(xf * xf, 1)


@triton.jit
def _dot(a, w, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a [BLOCK_M, BLOCK_K] @ w [BLOCK_N, BLOCK_K].T in fp32."""
    if UPCAST:  # the interpreter's numpy matmul has no bf16 (the values are bf16 already: exact)
        return tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)


@triton.jit
def _store_out(acc, Bias, Y, rows, cols, row_ok, col_ok, stride_y, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc = acc + tl.load(Bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], acc.to(Y.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@_rows_autotuned
@triton.jit
def _add_rmsnorm_linear_kernel(X, Delta, NormW, W, Bias, Y, Resid, M, N, K, M_BUCKET, eps,
                               stride_x, stride_d, stride_r, stride_w, stride_y,
                               HAS_DELTA: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               HAS_NORM: tl.constexpr = True):
    """y = (RMSNorm(x + delta) * norm_w) @ W.T (+ bias) in one pass over K: the row scale 1/rms factors out
    of the product, so each A tile is (x + delta) * norm_w and the rows' sums of squares accumulate beside
    the product; the scale is applied to the fp32 accumulator at the end. HAS_NORM False: (x + delta) @ W.T
    (a plain product, for timing against cuBLAS; the stream is not written)."""
    rows, cols, row_ok, col_ok, pid_n = _program_tile(M, N, BLOCK_M, BLOCK_N)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        ok = row_ok[:, None] & k_ok[None, :]
        if HAS_NORM:  # the first column slice writes the stream
            scaled, sq = _scaled_stream_tile(X, Delta, NormW, Resid, rows, ks, k_ok, ok, pid_n == 0,
                                             stride_x, stride_d, stride_r, HAS_DELTA)
            ss += sq
            a = scaled.to(W.dtype.element_ty)  # [BLOCK_M, BLOCK_K]
        else:
            a = _resid_tile(X, Delta, rows, ks, ok, stride_x, stride_d, HAS_DELTA).to(W.dtype.element_ty)
        w = tl.load(W + cols[:, None] * stride_w + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _dot(a, w, acc, PRECISION, UPCAST)  # [BLOCK_M, BLOCK_N]
    if HAS_NORM:
        acc = acc * (1.0 / tl.sqrt(ss / K + eps))[:, None]  # padding rows: 1/sqrt(eps), times 0
    _store_out(acc, Bias, Y, rows, cols, row_ok, col_ok, stride_y, HAS_BIAS)


@_rows_autotuned
@triton.jit
def _add_rmsnorm_gate_up_silu_kernel(X, Delta, NormW, W, Act, Resid, RowSS, M, N, K, M_BUCKET, eps, NT,
                                     stride_x, stride_d, stride_r, stride_w, stride_a, stride_ss,
                                     HAS_DELTA: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                     HAS_NORM: tl.constexpr = True, ROW_SCALE: tl.constexpr = False,
                                     NT_P: tl.constexpr = 1):
    """act [M, N] = silu(gate) * up of [gate | up] = (RMSNorm(x + delta) * norm_w) @ W.T, W = [W_gate; W_up]
    [2N, K]: each program multiplies its A tiles by the gate rows and the up rows of its N-slice (two
    accumulators, one pass over K as in `_add_rmsnorm_linear_kernel`), so the [M, 2N] product never
    goes through memory and the SiLU*up kernel disappears. gate and up are rounded to the dtype before
    the activation, as the unfused product's output is. HAS_NORM False: X is the normed stream already
    (the RMSNorm kernel ran before), each A tile is loaded as it is (Triton's pipelined operand path: no
    element-wise prologue), and only the SiLU*up epilogue is fused. ROW_SCALE (with HAS_NORM False): X is the
    un-normed stream, W has the norm weight folded in, and each row's 1/rms comes from its sums of squares by
    column tile, RowSS [M, NT], which the product that wrote the stream left (`specbench.kernels.norm_stats`)."""
    rows, cols, row_ok, col_ok, pid_n = _program_tile(M, N, BLOCK_M, BLOCK_N)  # gate rows: cols; up rows: N + cols
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        ok = row_ok[:, None] & k_ok[None, :]
        if HAS_NORM:
            scaled, sq = _scaled_stream_tile(X, Delta, NormW, Resid, rows, ks, k_ok, ok, pid_n == 0,
                                             stride_x, stride_d, stride_r, HAS_DELTA)
            ss += sq
            a = scaled.to(W.dtype.element_ty)
        else:
            a = tl.load(X + rows[:, None] * stride_x + ks[None, :], mask=ok, other=0.0)
        w_ok = col_ok[:, None] & k_ok[None, :]
        wg = tl.load(W + cols[:, None] * stride_w + ks[None, :], mask=w_ok, other=0.0)
        wu = tl.load(W + (N + cols)[:, None] * stride_w + ks[None, :], mask=w_ok, other=0.0)
        acc_g = _dot(a, wg, acc_g, PRECISION, UPCAST)
        acc_u = _dot(a, wu, acc_u, PRECISION, UPCAST)
    if HAS_NORM:
        inv = (1.0 / tl.sqrt(ss / K + eps))[:, None]
        acc_g, acc_u = acc_g * inv, acc_u * inv
    if ROW_SCALE:
        inv = _row_rstd(RowSS, rows, row_ok, NT, stride_ss, K, eps, NT_P)[:, None]
        acc_g, acc_u = acc_g * inv, acc_u * inv
    gate = acc_g.to(Act.dtype.element_ty)
    up = acc_u.to(Act.dtype.element_ty)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # F.silu rounds its output to the input dtype
    tl.store(Act + rows[:, None] * stride_a + cols[None, :], (act.to(tl.float32) * up.to(tl.float32)).to(Act.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@_rows_autotuned
@triton.jit
def _silu_mul_linear_kernel(GU, W, Y, M, N, K, M_BUCKET, stride_gu, stride_w, stride_y,
                            PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows, cols, row_ok, col_ok, pid_n = _program_tile(M, N, BLOCK_M, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # K = I: gate at column k, up at I + k
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        ok = row_ok[:, None] & k_ok[None, :]
        gate = tl.load(GU + rows[:, None] * stride_gu + ks[None, :], mask=ok, other=0.0)
        up = tl.load(GU + rows[:, None] * stride_gu + K + ks[None, :], mask=ok, other=0.0)
        g = gate.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # F.silu rounds its output to the input dtype
        a = (act.to(tl.float32) * up.to(tl.float32)).to(W.dtype.element_ty)
        w = tl.load(W + cols[:, None] * stride_w + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _dot(a, w, acc, PRECISION, UPCAST)
    _store_out(acc, W, Y, rows, cols, row_ok, col_ok, stride_y, False)


def _gemv(fn):
    return _autotuned(fn, _GEMV_CONFIGS, ("N", "K", "MODE"), _prune_gemv)


@_gemv
@triton.jit
def _gemv_kernel(X, Delta, NormW, W, Bias, Y, Resid, N, K, eps,
                 MODE: tl.constexpr, HAS_DELTA: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y [N] = a @ W.T for one row, a = RMSNorm(x + delta) * norm_w (MODE 0; resid = x + delta written by
    program 0), silu(gate) * up of X = [gate | up] (MODE 1, K = I) or x itself (MODE 2: a block's output
    product); + bias; W [N, K] contiguous rows."""
    pid = tl.program_id(0)
    cols = (pid * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # [BLOCK_N]
    col_ok = cols < N
    inv = 1.0
    if MODE == 0:  # pass 1: the row's sum of squares (K values: cheap next to the weight slice)
        ss = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(X + ks, mask=ks < K, other=0.0)
            if HAS_DELTA:
                x = (x.to(tl.float32) + tl.load(Delta + ks, mask=ks < K, other=0.0).to(tl.float32)).to(x.dtype)
            xf = x.to(tl.float32)
            ss += xf * xf
        inv = 1.0 / tl.sqrt(tl.sum(ss, 0) / K + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # pass 2: the prologue on the K-strip, times the weight strip
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        if MODE == 0:
            x = tl.load(X + ks, mask=k_ok, other=0.0)
            if HAS_DELTA:
                x = (x.to(tl.float32) + tl.load(Delta + ks, mask=k_ok, other=0.0).to(tl.float32)).to(x.dtype)
                if pid == 0:  # the first column slice writes the stream
                    tl.store(Resid + ks, x, mask=k_ok)
            normed = (x.to(tl.float32) * inv).to(x.dtype)  # RMSNorm casts back before the weight
            nw = tl.load(NormW + ks, mask=k_ok, other=0.0).to(tl.float32)
            a = (nw * normed.to(tl.float32)).to(W.dtype.element_ty)
        elif MODE == 2:
            a = tl.load(X + ks, mask=k_ok, other=0.0)
        else:
            gate = tl.load(X + ks, mask=k_ok, other=0.0)
            up = tl.load(X + K + ks, mask=k_ok, other=0.0)
            g = gate.to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # F.silu rounds its output to the input dtype
            a = (act.to(tl.float32) * up.to(tl.float32)).to(W.dtype.element_ty)
        w = tl.load(W + cols[:, None] * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += w.to(tl.float32) * a.to(tl.float32)[None, :]  # [BLOCK_N, BLOCK_K]
    y = tl.sum(acc, 1)  # [BLOCK_N]
    if HAS_BIAS:
        y = y + tl.load(Bias + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=col_ok)


def _gemv_grid(n: int):
    return lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)


def _rows(t: Tensor) -> Tensor:
    """[..., K] -> [M, K] with unit column stride."""
    r = t.reshape(-1, t.shape[-1])
    return r if r.stride(-1) == 1 else r.contiguous()


def _bucket(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


def _precision(dtype: torch.dtype) -> dict:
    """tl.dot's options: IEEE fp32 for fp32 inputs (not TF32); fp32 operands under the interpreter for bf16."""
    return {"PRECISION": "ieee" if dtype == torch.float32 else "tf32",  # tf32 is ignored for 16-bit inputs
            "UPCAST": interpreting() and dtype == torch.bfloat16}


def _grid(m: int, n: int):
    return lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)


def _check(x: Tensor, weight: Tensor, *others: Tensor | None) -> None:
    if weight.dim() != 2 or weight.stride(-1) != 1:
        raise ValueError(f"weight must be a [N, K] matrix with contiguous rows, got {tuple(weight.shape)}")
    bad = [t.dtype for t in (x, *others) if t is not None and t.dtype != weight.dtype]
    if bad:
        raise ValueError(f"add_rmsnorm_linear/add_rmsnorm_mlp/silu_mul_linear need one dtype, got {weight.dtype} and {bad}")


def add_rmsnorm_linear(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                       bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(y, resid): resid = x + delta (delta None: x itself), y = (RMSNorm(resid) * norm_weight) @ weight.T
    (+ bias). x, delta [..., K]; norm_weight [K]; weight [N, K]; bias [N]; y [..., N]; one dtype."""
    require_kernel_device(x)
    _check(x, weight, delta, norm_weight, bias)
    k, n = x.shape[-1], weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"weight {tuple(weight.shape)} does not take rows of {k}")
    rows = _rows(x)  # [M, K]
    m = rows.shape[0]
    dl = rows if delta is None else _rows(delta)
    resid = rows if delta is None else torch.empty_like(rows)
    y = torch.empty(m, n, dtype=weight.dtype, device=x.device)  # [M, N]
    if m == 1 and weight.is_contiguous():
        _gemv_kernel[_gemv_grid(n)](rows, dl, norm_weight, weight, weight if bias is None else bias, y, resid, n, k, eps,
                                    MODE=0, HAS_DELTA=delta is not None, HAS_BIAS=bias is not None)
        return y.view(*x.shape[:-1], n), (x if delta is None else resid.view(x.shape))
    _add_rmsnorm_linear_kernel[_grid(m, n)](
        rows, dl, norm_weight, weight, weight if bias is None else bias, y, resid, m, n, k, _bucket(m), eps,
        rows.stride(0), dl.stride(0), resid.stride(0), weight.stride(0), y.stride(0),
        HAS_DELTA=delta is not None, HAS_BIAS=bias is not None, **_precision(weight.dtype))
    return y.view(*x.shape[:-1], n), (x if delta is None else resid.view(x.shape))


def silu_mul_linear(gate_up: Tensor, weight: Tensor) -> Tensor:
    """(silu(gate) * up) @ weight.T for gate_up [..., 2I] (gate | up), weight [N, I] -> [..., N]."""
    require_kernel_device(gate_up)
    _check(gate_up, weight)
    inter, n = gate_up.shape[-1] // 2, weight.shape[0]
    if gate_up.shape[-1] != 2 * inter or weight.shape[1] != inter:
        raise ValueError(f"gate_up of {gate_up.shape[-1]} columns does not fit weight {tuple(weight.shape)}")
    rows = _rows(gate_up)  # [M, 2I]
    m = rows.shape[0]
    y = torch.empty(m, n, dtype=weight.dtype, device=gate_up.device)
    if m == 1 and weight.is_contiguous():
        _gemv_kernel[_gemv_grid(n)](rows, rows, weight, weight, weight, y, rows, n, inter, 0.0,
                                    MODE=1, HAS_DELTA=False, HAS_BIAS=False)
        return y.view(*gate_up.shape[:-1], n)
    _silu_mul_linear_kernel[_grid(m, n)](rows, weight, y, m, n, inter, _bucket(m), rows.stride(0), weight.stride(0),
                                         y.stride(0), **_precision(weight.dtype))
    return y.view(*gate_up.shape[:-1], n)


def output_linear(o: Tensor, weight: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """`LayerOps.output_linear` (x, o @ weight.T) with one row on the matrix-vector kernel: a decode step's wo,
    which cuBLAS's split-K product read at 2.7 TB/s on an H200 (Qwen3-8B shapes, 2026-12-03) where this kernel
    reads the other products at 3.7 (docs/measurements/README.md). More rows: F.linear."""
    require_kernel_device(o)
    _check(o, weight)
    k, n = o.shape[-1], weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"weight {tuple(weight.shape)} does not take rows of {k}")
    rows = _rows(o)  # [M, K]
    if rows.shape[0] != 1 or not weight.is_contiguous():
        return x, F.linear(o, weight)
    y = torch.empty(1, n, dtype=weight.dtype, device=o.device)
    _gemv_kernel[_gemv_grid(n)](rows, rows, weight, weight, weight, y, rows, n, k, 0.0,
                                MODE=2, HAS_DELTA=False, HAS_BIAS=False)
    return x, y.view(*o.shape[:-1], n)


def add_rmsnorm_mlp(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, gate_up_weight: Tensor,
                    down_weight: Tensor, norm_in_product: bool = False) -> tuple[Tensor, Tensor]:
    """The MLP block on the residual stream: (y, resid), resid = x + delta, y = down(silu(gate) * up) of
    [gate | up] = (RMSNorm(resid) * norm_weight) @ gate_up_weight.T. x, delta [..., K]; gate_up_weight
    [2I, K] (gate rows, then up rows); down_weight [N, I]. One row: two matrix-vector kernels (the norm
    in the first, SiLU*up in the second). More rows: the add+RMSNorm kernel, then the gate/up product with
    SiLU*up as its epilogue (`_add_rmsnorm_gate_up_silu_kernel`, HAS_NORM False: the [M, 2I] product never
    goes through memory, the A tiles are plain loads), then cuBLAS for the down product.
    `norm_in_product`: the norm in the product's prologue instead (one kernel for norm + gate/up + SiLU*up;
    slower on the H200 at 17 and 65 rows, kept to be timed: scripts/bench_norm_linear.py). fp32 on CUDA
    always takes that path: the plain-load kernel's pipelined fp32 tiles of 64-128 rows ask more shared
    memory than an H200 has (255 KB of 227, 2026-12-03), while the prologue keeps its loads in registers."""
    require_kernel_device(x)
    _check(x, gate_up_weight, delta, norm_weight, down_weight)
    k, inter = x.shape[-1], gate_up_weight.shape[0] // 2
    if gate_up_weight.shape != (2 * inter, k) or down_weight.shape[1] != inter:
        raise ValueError(f"gate/up weight {tuple(gate_up_weight.shape)} and down weight {tuple(down_weight.shape)} "
                         f"do not make an MLP over rows of {k}")
    rows = _rows(x)
    m = rows.shape[0]
    if m == 1 and gate_up_weight.is_contiguous():
        gate_up, resid = add_rmsnorm_linear(x, delta, norm_weight, eps, gate_up_weight)
        return silu_mul_linear(gate_up, down_weight), resid
    act = torch.empty(m, inter, dtype=x.dtype, device=x.device)  # [M, I]
    if norm_in_product or (x.is_cuda and x.dtype == torch.float32):  # fp32 on CUDA: see the docstring
        dl = rows if delta is None else _rows(delta)
        resid = rows if delta is None else torch.empty_like(rows)
        _add_rmsnorm_gate_up_silu_kernel[_grid(m, inter)](
            rows, dl, norm_weight, gate_up_weight, act, resid, rows, m, inter, k, _bucket(m), eps, 0,
            rows.stride(0), dl.stride(0), resid.stride(0), gate_up_weight.stride(0), act.stride(0), 0,
            HAS_DELTA=delta is not None, **_precision(x.dtype))
        resid_out = x if delta is None else resid.view(x.shape)
    else:
        h, resid_out = rmsnorm(x, norm_weight, eps, delta)
        hr = _rows(h)  # [M, K] normed
        _add_rmsnorm_gate_up_silu_kernel[_grid(m, inter)](
            hr, hr, norm_weight, gate_up_weight, act, hr, hr, m, inter, k, _bucket(m), eps, 0,
            hr.stride(0), hr.stride(0), hr.stride(0), gate_up_weight.stride(0), act.stride(0), 0,
            HAS_DELTA=False, HAS_NORM=False, **_precision(x.dtype))
    y = F.linear(act, down_weight)
    return y.view(*x.shape[:-1], y.shape[-1]), resid_out


def add_rmsnorm_then_linear(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                            bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`add_rmsnorm_linear` as two launches: the fused RMSNorm kernel, then cuBLAS (any M, any dtypes)."""
    h, resid = rmsnorm(x, norm_weight, eps, delta)
    return F.linear(h, weight, bias), resid


def silu_mul_then_linear(gate_up: Tensor, weight: Tensor) -> Tensor:
    """`silu_mul_linear` as two launches: the fused SiLU*up kernel, then cuBLAS."""
    return F.linear(silu_mul(gate_up), weight)


def add_rmsnorm_mlp_then_linear(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float,
                                gate_up_weight: Tensor, down_weight: Tensor) -> tuple[Tensor, Tensor]:
    """`add_rmsnorm_mlp` as four launches: RMSNorm, cuBLAS, SiLU*up, cuBLAS (any M, any dtypes)."""
    gate_up, resid = add_rmsnorm_then_linear(x, delta, norm_weight, eps, gate_up_weight)
    return silu_mul_then_linear(gate_up, down_weight), resid


def fits(x: Tensor, weight: Tensor, *others: Tensor | None) -> bool:
    """Whether the fused kernels take these inputs: at most MAX_ROWS rows and one dtype."""
    return (x.numel() // max(1, x.shape[-1]) <= MAX_ROWS and weight.stride(-1) == 1
            and all(t is None or t.dtype == weight.dtype for t in (x, *others)))


def add_rmsnorm_linear_fits(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                            bias: Tensor | None = None) -> bool:
    return fits(x, weight, delta, norm_weight, bias)


def add_rmsnorm_mlp_fits(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, gate_up_weight: Tensor,
                         down_weight: Tensor) -> bool:
    return fits(x, gate_up_weight, delta, norm_weight, down_weight) and down_weight.stride(-1) == 1


def silu_mul_linear_fits(gate_up: Tensor, weight: Tensor) -> bool:
    return fits(gate_up, weight)


def output_linear_fits(o: Tensor, weight: Tensor, x: Tensor) -> bool:
    """One row (where `output_linear` runs its own kernel), contiguous weight, one dtype."""
    return o.numel() == o.shape[-1] and weight.is_contiguous() and o.dtype == weight.dtype


__all__ = ["add_rmsnorm_linear", "add_rmsnorm_mlp", "silu_mul_linear", "add_rmsnorm_then_linear",
           "add_rmsnorm_mlp_then_linear", "silu_mul_then_linear", "add_rmsnorm_linear_fits", "add_rmsnorm_mlp_fits",
           "silu_mul_linear_fits", "output_linear", "output_linear_fits", "MAX_ROWS", "row_configs",
           "covering_row_tiles"]
