"""Fused decoder-layer kernels: what turns ~40 launches per layer into ~9 on the GPU.

On a target as small as SmolLM2 a decode step is bound by kernel launches, not bytes (30 layers; the
eager layer runs ~40 small kernels: RMSNorm alone is six element-wise ops). These kernels fuse the
element-wise work between the matrix products, so a layer is

    add_rmsnorm -> wqkv GEMM -> qkv_rope (q/k-norm, RoPE, K/V into the cache) -> attention -> wo GEMM
    -> add_rmsnorm -> gate/up GEMM -> silu_mul -> down GEMM

Each kernel rounds where the PyTorch module it replaces rounds (a bf16 product is rounded to bf16
before the next op, as PyTorch's bf16 ops do), so in bf16 it matches the eager decoder to the last
bit except where libm and the GPU disagree on an fp32 value (rsqrt); in fp32 every rounding is a no-op.
References: `specbench.kernels.reference` (rmsnorm_reference, qkv_rope_reference, silu_mul_reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device


@triton.jit
def _rmsnorm_kernel(X, Delta, W, Out, Resid, stride_x, stride_d, stride_o, stride_r, n_cols, eps,
                    HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_DELTA:  # the residual add, rounded to the stream's dtype as `x + delta` is
        d = tl.load(Delta + row * stride_d + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
        tl.store(Resid + row * stride_r + cols, x, mask=ok)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    normed = (xf * inv).to(x.dtype)  # RMSNorm casts back before the weight
    w = tl.load(W + cols, mask=ok, other=0.0)
    tl.store(Out + row * stride_o + cols, (w.to(tl.float32) * normed.to(tl.float32)).to(Out.dtype.element_ty), mask=ok)


def rmsnorm(x: Tensor, weight: Tensor, eps: float, delta: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(RMSNorm(x + delta) * weight, x + delta) for x, delta [..., d] (delta None: x itself is the stream).
    Rows must be contiguous in the last dim."""
    require_kernel_device(x)
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if delta is None:
        resid, dl = rows, rows
    else:
        dl = delta.reshape(-1, d)
        if dl.stride(-1) != 1:
            dl = dl.contiguous()
        resid = torch.empty_like(rows)
    _rmsnorm_kernel[(rows.shape[0],)](rows, dl, weight, out, resid, rows.stride(0), dl.stride(0), out.stride(0),
                                      resid.stride(0), d, eps, HAS_DELTA=delta is not None,
                                      BLOCK=triton.next_power_of_2(d), num_warps=4 if d <= 2048 else 8)
    return out.view(*x.shape[:-1], d), (x if delta is None else resid.view(x.shape))


@triton.jit
def _row_rstd(RowSS, rows, row_ok, NT, stride_ss, K, eps, NT_P: tl.constexpr):
    """[BLOCK_M] 1/rms of the rows from their sums of squares by column tile, RowSS [M, NT] fp32."""
    t = tl.arange(0, NT_P)
    parts = tl.load(RowSS + rows[:, None] * stride_ss + t[None, :], mask=row_ok[:, None] & (t[None, :] < NT),
                    other=0.0)
    return 1.0 / tl.sqrt(tl.sum(parts, 1) / K + eps)


@triton.jit
def _load_head(ptr, d, rot, W, eps, HAS_NORM: tl.constexpr, D: tl.constexpr, scale=1.0,
               ROW_SCALE: tl.constexpr = False):
    """One head at positions d and at the rotate-half partner positions, RMS-normed over the whole head
    (Qwen3's q/k norm: w * (x * inv).to(dtype), as `RMSNorm` rounds) when HAS_NORM; times the row's
    `scale` first (rounded) when ROW_SCALE."""
    x = tl.load(ptr + d)
    xr = tl.load(ptr + rot)
    if ROW_SCALE:
        x = (x.to(tl.float32) * scale).to(x.dtype)
        xr = (xr.to(tl.float32) * scale).to(xr.dtype)
    if HAS_NORM:
        xf = x.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / D + eps)
        x = (tl.load(W + d).to(tl.float32) * (xf * inv).to(x.dtype).to(tl.float32)).to(x.dtype)
        xr = (tl.load(W + rot).to(tl.float32) * (xr.to(tl.float32) * inv).to(xr.dtype).to(tl.float32)).to(xr.dtype)
    return x, xr


@triton.jit
def _rope(x, xr, d, cos, sin, half):
    """rotate-half RoPE with the reference's roundings: rotated = [-x2, x1]; x*cos and rotated*sin each
    rounded, then their sum."""
    rotated = tl.where(d < half, -xr.to(tl.float32), xr.to(tl.float32)).to(x.dtype)
    a = (x.to(tl.float32) * cos.to(tl.float32)).to(x.dtype)
    b = (rotated.to(tl.float32) * sin.to(tl.float32)).to(x.dtype)
    return (a.to(tl.float32) + b.to(tl.float32)).to(x.dtype)


@triton.jit
def _qkv_rope_kernel(QKV, Cos, Sin, QW, KW, Q, KC, VC, Slots, RowSS,
                     stride_qkv_row, stride_cs_row, stride_q_row,
                     stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, stride_ss,
                     N, H, HKV, eps, NT, K, stream_eps,
                     D: tl.constexpr, HAS_NORM: tl.constexpr, ROW_SCALE: tl.constexpr = False,
                     NT_P: tl.constexpr = 1):
    """ROW_SCALE: qkv is the product of the un-normed stream (K wide) with the norm weight folded into wqkv;
    each row is first scaled by its 1/rms, from its sums of squares by column tile RowSS [M, NT], and rounded."""
    row = tl.program_id(0).to(tl.int64)  # token row b * N + i
    head = tl.program_id(1)  # 0..H-1: q heads; H..H+HKV-1: k heads, each with its v head
    b = row // N
    half = D // 2
    d = tl.arange(0, D)
    rot = tl.where(d < half, d + half, d - half)
    cos = tl.load(Cos + row * stride_cs_row + d)
    sin = tl.load(Sin + row * stride_cs_row + d)
    base = QKV + row * stride_qkv_row
    scale = 1.0
    if ROW_SCALE:
        scale = tl.sum(_row_rstd(RowSS, row + tl.arange(0, 1), tl.full([1], 1, tl.int1), NT, stride_ss, K,
                                 stream_eps, NT_P), 0)
    if head < H:
        x, xr = _load_head(base + head * D, d, rot, QW, eps, HAS_NORM, D, scale, ROW_SCALE)
        tl.store(Q + row * stride_q_row + head * D + d, _rope(x, xr, d, cos, sin, half))
    else:
        kh = head - H
        x, xr = _load_head(base + (H + kh) * D, d, rot, KW, eps, HAS_NORM, D, scale, ROW_SCALE)
        k = _rope(x, xr, d, cos, sin, half)
        v = tl.load(base + (H + HKV + kh) * D + d)
        if ROW_SCALE:
            v = (v.to(tl.float32) * scale).to(v.dtype)
        slot = tl.load(Slots + row).to(tl.int64)
        tl.store(KC + b * stride_kb + kh * stride_kh + slot * stride_ks + d, k.to(KC.dtype.element_ty))
        tl.store(VC + b * stride_vb + kh * stride_vh + slot * stride_vs + d, v.to(VC.dtype.element_ty))


def qkv_rope(qkv: Tensor, cos: Tensor, sin: Tensor, n_heads: int, n_kv: int, head_dim: int, k_cache: Tensor,
             v_cache: Tensor, slots: Tensor, q_norm: Tensor | None = None, k_norm: Tensor | None = None,
             eps: float = 1e-6, row_sumsq: Tensor | None = None, stream_dim: int = 1,
             stream_eps: float = 1e-6) -> Tensor | None:
    """Split a fused projection qkv [B, N, (H + 2 Hkv) * D] (q heads | k heads | v heads), apply the
    per-head q/k RMSNorm (Qwen3; weights [D]) and rotate-half RoPE (cos, sin [B, N, 1, D]: the decoder's
    tables), write K and V into the caches [B, Hkv, S, D] at `slots` [B, N], and return q [B, H, N, D]
    (a view of a [B, N, H, D] buffer). n_heads=0: a k|v-only projection (draft-head context), returns None.
    `row_sumsq` [B * N, T] float32: qkv is the product of the un-normed stream (`stream_dim` wide) with the
    layer norm's weight folded into wqkv, and each row is scaled by its 1/rms (sums of squares by column tile,
    as `specbench.kernels.norm_stats.linear_residual` leaves them; `stream_eps` the norm's) before the rest."""
    require_kernel_device(qkv)
    b, n, width = qkv.shape
    if width != (n_heads + 2 * n_kv) * head_dim:
        raise ValueError(f"qkv has {width} columns for {n_heads} q + 2 x {n_kv} kv heads of {head_dim}")
    if head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two, got {head_dim}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("pass both q_norm and k_norm, or neither")
    rows = qkv.reshape(b * n, width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    cos2, sin2 = cos.reshape(b * n, head_dim), sin.reshape(b * n, head_dim)
    if cos2.stride(-1) != 1 or sin2.stride(-1) != 1 or cos2.stride(0) != sin2.stride(0):
        cos2, sin2 = cos2.contiguous(), sin2.contiguous()
    q = torch.empty(b, n, max(n_heads, 1), head_dim, dtype=qkv.dtype, device=qkv.device)
    slot_rows = slots.reshape(b * n)
    if slot_rows.stride(0) != 1:
        slot_rows = slot_rows.contiguous()
    has_norm = q_norm is not None
    scaled = row_sumsq is not None
    if scaled and (row_sumsq.dim() != 2 or row_sumsq.shape[0] != b * n or row_sumsq.dtype != torch.float32):
        raise ValueError(f"row_sumsq must be float32 [{b * n}, tiles], got {row_sumsq.dtype} {tuple(row_sumsq.shape)}")
    ss = row_sumsq if scaled else rows
    _qkv_rope_kernel[(b * n, n_heads + n_kv)](
        rows, cos2, sin2, q_norm if has_norm else rows, k_norm if has_norm else rows, q, k_cache, v_cache, slot_rows, ss,
        rows.stride(0), cos2.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        ss.stride(0), n, n_heads, n_kv, eps, ss.shape[1] if scaled else 0, stream_dim, stream_eps,
        D=head_dim, HAS_NORM=has_norm, ROW_SCALE=scaled, NT_P=triton.next_power_of_2(ss.shape[1]) if scaled else 1,
        num_warps=1)
    return q.transpose(1, 2) if n_heads > 0 else None


@triton.jit
def _silu_mul_kernel(X, Out, stride_x, stride_o, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    gate = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    up = tl.load(X + row * stride_x + n_cols + cols, mask=ok, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # F.silu rounds its output to the input dtype
    tl.store(Out + row * stride_o + cols, (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype), mask=ok)


def silu_mul(gate_up: Tensor) -> Tensor:
    """gate_up [..., 2I] (gate | up) -> silu(gate) * up [..., I]."""
    require_kernel_device(gate_up)
    width = gate_up.shape[-1]
    inter = width // 2
    rows = gate_up.reshape(-1, width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], inter, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(inter))
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(inter, block))](rows, out, rows.stride(0), out.stride(0), inter,
                                                                 BLOCK=block, num_warps=4)
    return out.view(*gate_up.shape[:-1], inter)


__all__ = ["rmsnorm", "qkv_rope", "silu_mul"]
