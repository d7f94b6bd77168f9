"""The element-wise op fused into the matrix product after it, for the few rows of decode and tree verify.

A decode step of a small target is launch-bound: per layer, add+RMSNorm -> wqkv, add+RMSNorm -> gate/up
and silu*up -> down are six kernels of a few microseconds each, mostly launch and tail. With M = B*N rows
(1 .. ~130) the element-wise op is free inside the product: each program recomputes its rows' RMS
statistics (a BLOCK_M x K read, tiny next to its BLOCK_N x K slice of the weight) and normalises (or
activates) the A tile as it loads it, so the normed activations never go through memory and three
launches per layer disappear. BLOCK_M is 16 (tl.dot's smallest tile; M is padded by masked loads); the
row tiles of one weight slice are neighbouring programs, so the slice is read from HBM once.

Rounding follows the reference composition (`specbench.kernels.reference`): the residual add in the
stream's dtype, the norm in fp32 cast to the dtype before the norm weight, that product cast to the
dtype; silu(gate) cast, times up, cast; the matrix product accumulates in fp32 (tl.dot in IEEE fp32 for
fp32 inputs, not TF32) and adds the bias in fp32 before the final cast. So fp32 agrees with the
reference to accumulation order, bf16 to one rounding of the output.

One row (a decode step, a draft head's single row) takes a matrix-vector kernel instead (`_gemv_kernel`):
no tl.dot tile of 16 rows of which 15 are padding, each program a few output columns (many programs, so
a memory-bound weight read spreads over the whole GPU) and the row's prologue (RMS statistics, or
SiLU*up) recomputed per program from the K-vector, which is tiny next to its BLOCK_N x K weight slice.
Same rounding as the tile kernels; the fp32 sum runs along each program's columns in BLOCK_K strips.

Tile sizes come from `triton.autotune` per (row bucket, N, K, dtypes): autotuning benchmarks, so a new
key must first be seen outside CUDA-graph capture (`specbench.kernels.per_shape.FasterPerShape` does
that, and falls back to the composition for a key first seen during capture). The fallbacks
`add_rmsnorm_then_linear` / `silu_mul_then_linear` are the element-wise kernels + cuBLAS.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor
from triton.testing import do_bench

from specbench.kernels.device import autotune_first_only, interpreting, require_kernel_device
from specbench.kernels.fused import rmsnorm, silu_mul

BLOCK_M = 16
MAX_ROWS = 128  # beyond this (prefill) the product is compute-bound: cuBLAS with the element-wise kernel
_INTERPRETER_CONFIG = triton.Config({"BLOCK_N": 16, "BLOCK_K": 32}, num_warps=4)  # small: loops over K and N
_CONFIGS = [  # memory-bound shapes: narrow N slices (many programs), long K tiles, deep pipelines
    triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
    for n, k, w, s in [(16, 256, 4, 4), (32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 4), (64, 256, 8, 3),
                       (128, 64, 4, 4), (128, 128, 8, 3), (256, 64, 8, 3)]
]


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
    do not exceed N and K (rounded up to powers of two, at least min_n / min_k); only the first of them under
    SPECBENCH_AUTOTUNE=first (correctness runs)."""
    def prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
        if interpreting():
            return [interpreter_config]
        n, k = named_args["N"], named_args["K"]
        kept = [c for c in configs if c.kwargs["BLOCK_N"] <= max(min_n, triton.next_power_of_2(n))
                and c.kwargs["BLOCK_K"] <= max(min_k, triton.next_power_of_2(k))]
        kept = kept or configs[:1]
        return kept[:1] if autotune_first_only() else kept
    return prune


_prune = _pruner(_INTERPRETER_CONFIG, 16, 16)
_prune_gemv = _pruner(_GEMV_INTERPRETER_CONFIG, 4, 128)


def _autotuned(fn, configs: list[triton.Config] = _CONFIGS, key: tuple[str, ...] = ("M_BUCKET", "N", "K"), prune=_prune):
    return triton.autotune(
        configs=configs, key=list(key), prune_configs_by={"early_config_prune": prune},
        do_bench=lambda call, quantiles: do_bench(call, warmup=5, rep=20, quantiles=quantiles),  # ms, not the default 125
    )(fn)


@triton.jit
def _resid_tile(X, Delta, rows, ks, ok, stride_x, stride_d, HAS_DELTA: tl.constexpr):
    """[BLOCK_M, BLOCK_K] of the residual stream x + delta, rounded to the stream's dtype as `x + delta` is."""
    x = tl.load(X + rows[:, None] * stride_x + ks[None, :], mask=ok, other=0.0)
    if HAS_DELTA:
        d = tl.load(Delta + rows[:, None] * stride_d + ks[None, :], mask=ok, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
    return x


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


@_autotuned
@triton.jit
def _add_rmsnorm_linear_kernel(X, Delta, NormW, W, Bias, Y, Resid, M, N, K, M_BUCKET, eps,
                               stride_x, stride_d, stride_r, stride_w, stride_y,
                               HAS_DELTA: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m, pid_n = pid % num_m, pid // num_m  # row tiles of one weight slice side by side
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # [BLOCK_M]
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # [BLOCK_N]
    row_ok, col_ok = rows < M, cols < N
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)  # pass 1: the rows' sum of squares
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        xf = _resid_tile(X, Delta, rows, ks, row_ok[:, None] & (ks < K)[None, :], stride_x, stride_d,
                         HAS_DELTA).to(tl.float32)
        ss += tl.sum(xf * xf, 1)
    inv = 1.0 / tl.sqrt(ss / K + eps)  # [BLOCK_M]; padding rows: 1/sqrt(eps), times 0
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # pass 2: normalise the A tile as it is loaded, multiply
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        ok = row_ok[:, None] & k_ok[None, :]
        x = _resid_tile(X, Delta, rows, ks, ok, stride_x, stride_d, HAS_DELTA)  # [BLOCK_M, BLOCK_K]
        if HAS_DELTA:
            if pid_n == 0:  # the first column slice writes the stream
                tl.store(Resid + rows[:, None] * stride_r + ks[None, :], x, mask=ok)
        normed = (x.to(tl.float32) * inv[:, None]).to(x.dtype)  # RMSNorm casts back before the weight
        nw = tl.load(NormW + ks, mask=k_ok, other=0.0).to(tl.float32)
        a = (nw[None, :] * normed.to(tl.float32)).to(W.dtype.element_ty)
        w = tl.load(W + cols[:, None] * stride_w + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _dot(a, w, acc, PRECISION, UPCAST)  # [BLOCK_M, BLOCK_N]
    _store_out(acc, Bias, Y, rows, cols, row_ok, col_ok, stride_y, HAS_BIAS)


@_autotuned
@triton.jit
def _silu_mul_linear_kernel(GU, W, Y, M, N, K, M_BUCKET, stride_gu, stride_w, stride_y,
                            PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m, pid_n = pid % num_m, pid // num_m
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok, col_ok = rows < M, cols < N
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
    program 0) or silu(gate) * up of X = [gate | up] (MODE 1, K = I); + bias; W [N, K] contiguous rows."""
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
    return max(BLOCK_M, triton.next_power_of_2(m))


def _precision(dtype: torch.dtype) -> dict:
    """tl.dot's options: IEEE fp32 for fp32 inputs (not TF32); fp32 operands under the interpreter for bf16."""
    return {"PRECISION": "ieee" if dtype == torch.float32 else "tf32",  # tf32 is ignored for 16-bit inputs
            "UPCAST": interpreting() and dtype == torch.bfloat16}


def _grid(m: int, n: int):
    return lambda meta: (triton.cdiv(m, BLOCK_M) * triton.cdiv(n, meta["BLOCK_N"]),)


def _check(x: Tensor, weight: Tensor, *others: Tensor | None) -> None:
    if weight.dim() != 2 or weight.stride(-1) != 1:
        raise ValueError(f"weight must be a [N, K] matrix with contiguous rows, got {tuple(weight.shape)}")
    bad = [t.dtype for t in (x, *others) if t is not None and t.dtype != weight.dtype]
    if bad:
        raise ValueError(f"add_rmsnorm_linear/silu_mul_linear need one dtype, got {weight.dtype} and {bad}")


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
        HAS_DELTA=delta is not None, HAS_BIAS=bias is not None, **_precision(weight.dtype), BLOCK_M=BLOCK_M)
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
                                         y.stride(0), **_precision(weight.dtype), BLOCK_M=BLOCK_M)
    return y.view(*gate_up.shape[:-1], n)


def add_rmsnorm_then_linear(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                            bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`add_rmsnorm_linear` as two launches: the fused RMSNorm kernel, then cuBLAS (any M, any dtypes)."""
    h, resid = rmsnorm(x, norm_weight, eps, delta)
    return F.linear(h, weight, bias), resid


def silu_mul_then_linear(gate_up: Tensor, weight: Tensor) -> Tensor:
    """`silu_mul_linear` as two launches: the fused SiLU*up kernel, then cuBLAS."""
    return F.linear(silu_mul(gate_up), weight)


def fits(x: Tensor, weight: Tensor, *others: Tensor | None) -> bool:
    """Whether the fused kernels take these inputs: at most MAX_ROWS rows and one dtype."""
    return (x.numel() // max(1, x.shape[-1]) <= MAX_ROWS and weight.stride(-1) == 1
            and all(t is None or t.dtype == weight.dtype for t in (x, *others)))


def add_rmsnorm_linear_fits(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                            bias: Tensor | None = None) -> bool:
    return fits(x, weight, delta, norm_weight, bias)


def silu_mul_linear_fits(gate_up: Tensor, weight: Tensor) -> bool:
    return fits(gate_up, weight)


__all__ = ["add_rmsnorm_linear", "silu_mul_linear", "add_rmsnorm_then_linear", "silu_mul_then_linear",
           "add_rmsnorm_linear_fits", "silu_mul_linear_fits", "MAX_ROWS"]
