"""The attention block's input projection with its head-wise epilogue: normed x @ Wqkv.T, then per head the
q/k RMSNorm (Qwen3), rotate-half RoPE, q into its buffer and K/V into the caches at their slots, in one kernel
for the few rows of tree verify.

Unfused, verify runs per layer the add+RMSNorm kernel, cuBLAS for wqkv and `specbench.kernels.fused.qkv_rope`
(a kernel reading the [M, (H + 2 Hkv) D] projection back). Here each program owns one head of one row tile:
its D output columns as two accumulators of D/2 (the rotate-half partners, so RoPE needs no data movement), the
A tiles plain loads (no prologue: what Triton pipelines; the add+RMSNorm stays its own kernel before, as the
H200 measured a prologue on the A tile to cost more than it saves: `norm_linear`'s docstring). One row (the
decode step) keeps the matrix-vector kernel + `qkv_rope`.

Rounding is the unfused path's: the product accumulates in fp32 and is rounded to the dtype (F.linear's
output), then the q/k norm and RoPE round where `qkv_rope` does. fp32 on CUDA takes the unfused path (the
pipelined fp32 tiles of 64-128 rows outgrow the H200's shared memory, as `norm_linear`'s MLP kernel's do).
Reference: `specbench.kernels.reference.add_rmsnorm_qkv_rope_reference`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.testing import do_bench

from specbench.kernels.device import autotune_kept, interpreting, require_kernel_device
from specbench.kernels.fused import qkv_rope, rmsnorm
from specbench.kernels.norm_linear import (MAX_ROWS, _bucket, _dot, _precision, add_rmsnorm_linear,
                                           add_rmsnorm_then_linear, covering_row_tiles)

_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_K": bk}, num_warps=4 if bm <= 32 else 8, num_stages=st)
            for bm in (16, 32, 64, 128) for bk, st in ((64, 3), (128, 3), (64, 4))]
_INTERPRETER_CONFIG = triton.Config({"BLOCK_M": 16, "BLOCK_K": 32}, num_warps=4)


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Row tiles up to the one that covers M, smaller ones too (a program owns one head, so at 65 rows
    two tiles of 64 leave SmolLM2's 15 heads 30 programs for 132 SMs: the H200 ran them 8.9 us against
    6.2 unfused, docs/measurements/README.md); K strips no longer than K; the smallest only under
    SPECBENCH_AUTOTUNE=first; the interpreter's one small config."""
    if interpreting():
        return [_INTERPRETER_CONFIG]
    cover = max(c.kwargs["BLOCK_M"] for c in covering_row_tiles(configs, named_args["M_BUCKET"]))
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= cover
            and c.kwargs["BLOCK_K"] <= max(64, triton.next_power_of_2(named_args["K"]))] or configs[:1]
    return autotune_kept(kept)


@triton.autotune(configs=_CONFIGS, key=["M_BUCKET", "K", "HALF"], prune_configs_by={"early_config_prune": _prune},
                 do_bench=lambda call, quantiles: do_bench(call, warmup=5, rep=20, quantiles=quantiles))
@triton.jit
def _qkv_rope_linear_kernel(X, W, Bias, Cos, Sin, QW, KW, Q, KC, VC, Slots, M, K, M_BUCKET, N_TOK, H, HKV, eps,
                            stride_x, stride_w, stride_cs, stride_q, stride_kb, stride_kh, stride_ks,
                            stride_vb, stride_vh, stride_vs,
                            HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, PRECISION: tl.constexpr,
                            UPCAST: tl.constexpr, HALF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m, head = pid % num_m, pid // num_m  # heads 0..H-1: q; H..H+HKV-1: k; then v
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # token rows b * N + i
    row_ok = rows < M
    d = tl.arange(0, HALF)
    col_lo = (head * 2 * HALF + d).to(tl.int64)  # the head's first half of columns; its rotate-half partners at + HALF
    acc_lo = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    acc_hi = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(X + rows[:, None] * stride_x + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_lo = tl.load(W + col_lo[:, None] * stride_w + ks[None, :], mask=k_ok[None, :], other=0.0)
        w_hi = tl.load(W + (col_lo + HALF)[:, None] * stride_w + ks[None, :], mask=k_ok[None, :], other=0.0)
        acc_lo = _dot(a, w_lo, acc_lo, PRECISION, UPCAST)  # [BLOCK_M, HALF]
        acc_hi = _dot(a, w_hi, acc_hi, PRECISION, UPCAST)
    if HAS_BIAS:
        acc_lo += tl.load(Bias + col_lo).to(tl.float32)[None, :]
        acc_hi += tl.load(Bias + col_lo + HALF).to(tl.float32)[None, :]
    x_lo = acc_lo.to(Q.dtype.element_ty)  # the projection's output, rounded as F.linear's is
    x_hi = acc_hi.to(Q.dtype.element_ty)
    ok = row_ok[:, None]
    if head < H + HKV:  # a q or k head: its norm (Qwen3), then RoPE, with `qkv_rope`'s roundings
        if HAS_NORM:
            xf_lo, xf_hi = x_lo.to(tl.float32), x_hi.to(tl.float32)
            inv = (1.0 / tl.sqrt((tl.sum(xf_lo * xf_lo, 1) + tl.sum(xf_hi * xf_hi, 1)) / (2 * HALF) + eps))[:, None]
            if head < H:
                nw_lo, nw_hi = tl.load(QW + d).to(tl.float32), tl.load(QW + HALF + d).to(tl.float32)
            else:
                nw_lo, nw_hi = tl.load(KW + d).to(tl.float32), tl.load(KW + HALF + d).to(tl.float32)
            x_lo = (nw_lo[None, :] * (xf_lo * inv).to(x_lo.dtype).to(tl.float32)).to(x_lo.dtype)
            x_hi = (nw_hi[None, :] * (xf_hi * inv).to(x_hi.dtype).to(tl.float32)).to(x_hi.dtype)
        cs = rows[:, None] * stride_cs + d[None, :]
        cos_lo = tl.load(Cos + cs, mask=ok, other=0.0).to(tl.float32)
        cos_hi = tl.load(Cos + cs + HALF, mask=ok, other=0.0).to(tl.float32)
        sin_lo = tl.load(Sin + cs, mask=ok, other=0.0).to(tl.float32)
        sin_hi = tl.load(Sin + cs + HALF, mask=ok, other=0.0).to(tl.float32)
        # rotated = [-x_hi, x_lo]; x * cos and rotated * sin each rounded, then their sum
        y_lo = ((x_lo.to(tl.float32) * cos_lo).to(x_lo.dtype).to(tl.float32)
                + (-x_hi.to(tl.float32) * sin_lo).to(x_lo.dtype).to(tl.float32)).to(x_lo.dtype)
        y_hi = ((x_hi.to(tl.float32) * cos_hi).to(x_lo.dtype).to(tl.float32)
                + (x_lo.to(tl.float32) * sin_hi).to(x_lo.dtype).to(tl.float32)).to(x_lo.dtype)
    else:  # a v head goes into the cache as projected
        y_lo, y_hi = x_lo, x_hi
    if head < H:
        qp = Q + rows[:, None] * stride_q + head * 2 * HALF + d[None, :]
        tl.store(qp, y_lo, mask=ok)
        tl.store(qp + HALF, y_hi, mask=ok)
    else:
        b = rows // N_TOK
        slot = tl.load(Slots + rows, mask=row_ok, other=0).to(tl.int64)
        if head < H + HKV:
            base = KC + b * stride_kb + (head - H) * stride_kh + slot * stride_ks
        else:
            base = VC + b * stride_vb + (head - H - HKV) * stride_vh + slot * stride_vs
        tl.store(base[:, None] + d[None, :], y_lo.to(KC.dtype.element_ty), mask=ok)
        tl.store(base[:, None] + HALF + d[None, :], y_hi.to(KC.dtype.element_ty), mask=ok)


def add_rmsnorm_qkv_rope(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                         bias: Tensor | None, cos: Tensor, sin: Tensor, n_heads: int, n_kv: int, head_dim: int,
                         k_cache: Tensor, v_cache: Tensor, slots: Tensor, q_norm: Tensor | None = None,
                         k_norm: Tensor | None = None, qk_eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """(q [B, H, N, D], resid = x + delta) of the attention block's input: RMSNorm(resid) * norm_weight @
    weight.T (+ bias) split into heads, q/k-normed (q_norm, k_norm [D]: Qwen3), RoPE'd (cos, sin [B, N, 1, D]),
    K and V written into the caches [B, Hkv, S, D] at `slots` [B, N]: `add_rmsnorm_linear` then `qkv_rope`.
    One row, or fp32 on CUDA: those two; more rows: the RMSNorm kernel, then `_qkv_rope_linear_kernel`."""
    require_kernel_device(x)
    b, n, k = x.shape
    if weight.shape != ((n_heads + 2 * n_kv) * head_dim, k) or n_heads < 1:
        raise ValueError(f"wqkv {tuple(weight.shape)} is not ({n_heads} + 2 x {n_kv}) heads of {head_dim} over {k}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("pass both q_norm and k_norm, or neither")
    m = b * n
    if m == 1:  # the matrix-vector kernel with the norm inside, then the head kernel
        qkv, resid = add_rmsnorm_linear(x, delta, norm_weight, eps, weight, bias)
        return qkv_rope(qkv, cos, sin, n_heads, n_kv, head_dim, k_cache, v_cache, slots, q_norm, k_norm, qk_eps), resid
    if x.is_cuda and x.dtype == torch.float32:
        return add_rmsnorm_qkv_rope_then_split(x, delta, norm_weight, eps, weight, bias, cos, sin, n_heads, n_kv,
                                               head_dim, k_cache, v_cache, slots, q_norm, k_norm, qk_eps)
    h, resid = rmsnorm(x, norm_weight, eps, delta)
    rows = h.reshape(m, k)
    cos2, sin2 = cos.reshape(m, head_dim), sin.reshape(m, head_dim)
    if cos2.stride(-1) != 1 or sin2.stride(-1) != 1 or cos2.stride(0) != sin2.stride(0):
        cos2, sin2 = cos2.contiguous(), sin2.contiguous()
    slot_rows = slots.reshape(m).contiguous()
    q = torch.empty(b, n, n_heads, head_dim, dtype=x.dtype, device=x.device)  # [B, N, H, D]
    has_norm = q_norm is not None
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * (n_heads + 2 * n_kv),)  # noqa: E731
    _qkv_rope_linear_kernel[grid](
        rows, weight, weight if bias is None else bias, cos2, sin2, q_norm if has_norm else weight,
        k_norm if has_norm else weight, q, k_cache, v_cache, slot_rows, m, k, _bucket(m), n, n_heads, n_kv, qk_eps,
        rows.stride(0), weight.stride(0), cos2.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HAS_BIAS=bias is not None, HAS_NORM=has_norm, HALF=head_dim // 2, **_precision(x.dtype))
    return q.transpose(1, 2), resid


def add_rmsnorm_qkv_rope_then_split(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                                    bias: Tensor | None, cos: Tensor, sin: Tensor, n_heads: int, n_kv: int,
                                    head_dim: int, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
                                    q_norm: Tensor | None = None, k_norm: Tensor | None = None,
                                    qk_eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """`add_rmsnorm_qkv_rope` as three launches: the RMSNorm kernel, cuBLAS, `qkv_rope` (any M, any dtypes)."""
    qkv, resid = add_rmsnorm_then_linear(x, delta, norm_weight, eps, weight, bias)
    return qkv_rope(qkv, cos, sin, n_heads, n_kv, head_dim, k_cache, v_cache, slots, q_norm, k_norm, qk_eps), resid


def add_rmsnorm_qkv_rope_fits(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                              bias: Tensor | None, cos: Tensor, sin: Tensor, n_heads: int, n_kv: int, head_dim: int,
                              k_cache: Tensor, v_cache: Tensor, slots: Tensor, q_norm: Tensor | None = None,
                              k_norm: Tensor | None = None, qk_eps: float = 1e-6) -> bool:
    """Rows up to MAX_ROWS, one dtype, contiguous weight rows, a power-of-two head of at least 32 (tl.dot's
    16-wide halves) and k/v caches of the stream's dtype."""
    return (x.numel() // max(1, x.shape[-1]) <= MAX_ROWS and weight.stride(-1) == 1 and head_dim >= 32
            and head_dim & (head_dim - 1) == 0 and n_heads >= 1
            and all(t is None or t.dtype == weight.dtype for t in (x, delta, norm_weight, bias))
            and k_cache.dtype == v_cache.dtype == x.dtype)


__all__ = ["add_rmsnorm_qkv_rope", "add_rmsnorm_qkv_rope_then_split", "add_rmsnorm_qkv_rope_fits"]
