"""RMSNorm's statistics from the product that writes the residual stream, so the norm needs no kernel of its own.

At verify's ~65 rows a layer of the small target is latency-bound: nine kernels of 1.5-5 us, two of them the
add+RMSNorm kernels (1.6 us each and a launch gap, 2026-12-03, docs/measurements/README.md), because an element-wise
prologue on a product's A tile measured slower than the kernel it saves. This takes the norm apart instead:

    RMSNorm(x) * g @ W.T = (x @ (W * g).T) / rms(x)

- `linear_residual`: the product that ends a block (wo, down) adds the residual in its epilogue and writes the new
  stream x' = x + a @ W.T, and each program also writes the sums of squares of its column tile of x', one fp32 per
  (row, tile) in `row_sumsq` [M, T]: no atomics, so no workspace to zero, and the sum is deterministic.
- The product that starts the next block reads x' as plain A tiles with the norm weight folded into its weight
  (`fold_norm`), and scales each row of its fp32 accumulator by 1 / rms from the T partial sums: the MLP's gate/up
  kernel (`gate_up_silu_scaled`, SiLU*up as before), or cuBLAS for wqkv followed by `qkv_rope(..., row_sumsq=)`,
  which scales the rows before the q/k norm and RoPE.

Rounding: delta = a @ W.T rounded to the dtype, then x + delta in fp32 rounded (as the unfused `x + F.linear`);
the sums of squares are of the rounded x'. The consumer's product is of x' and the folded weight (g * W rounded
once), scaled in fp32 and rounded once: one rounding of the normed activations less than the reference, one of the
folded weight more, so bf16 agrees with the unfused ops to a few roundings and fp32 to rounding order.
References: `specbench.kernels.reference.linear_residual_reference`, `gate_up_silu_scaled_reference`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import autotune_kept, interpreting, require_kernel_device
from specbench.kernels.norm_linear import (_add_rmsnorm_gate_up_silu_kernel, _autotuned, _bucket, _dot, _grid,
                                           _precision, _rows, covering_row_tiles, row_configs)

SUMSQ_TILE = 32  # the column tile of `linear_residual` (fixed, so the consumers know row_sumsq's width)
_CONFIGS = row_configs(tiles=((SUMSQ_TILE, 64, 4), (SUMSQ_TILE, 128, 3)))
_INTERPRETER_CONFIG = triton.Config({"BLOCK_M": 16, "BLOCK_N": SUMSQ_TILE, "BLOCK_K": 32}, num_warps=4)


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The row tiles that cover M (all of width SUMSQ_TILE); the interpreter's one small config."""
    if interpreting():
        return [_INTERPRETER_CONFIG]
    return autotune_kept(covering_row_tiles(configs, named_args["M_BUCKET"]) or configs)


@lambda fn: _autotuned(fn, _CONFIGS, ("M_BUCKET", "N", "K"), _prune)
@triton.jit
def _linear_residual_kernel(A, W, X, Out, RowSS, M, N, K, M_BUCKET, stride_a, stride_w, stride_x, stride_o, stride_ss,
                            PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out [M, N] = x + a @ W.T with plain A loads; RowSS[m, pid_n] = the sum over this program's columns of out[m]^2."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m, pid_n = pid % num_m, pid // num_m  # row tiles of one weight slice side by side
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # [BLOCK_M]
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # [BLOCK_N]
    row_ok, col_ok = rows < M, cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(A + rows[:, None] * stride_a + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(W + cols[:, None] * stride_w + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _dot(a, w, acc, PRECISION, UPCAST)  # [BLOCK_M, BLOCK_N]
    ok = row_ok[:, None] & col_ok[None, :]
    delta = acc.to(Out.dtype.element_ty).to(tl.float32)  # the product rounded, as F.linear's output is
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    out = (x + delta).to(Out.dtype.element_ty)  # [BLOCK_M, BLOCK_N]
    tl.store(Out + rows[:, None] * stride_o + cols[None, :], out, mask=ok)
    of = tl.where(ok, out.to(tl.float32), 0.0)
    tl.store(RowSS + rows * stride_ss + pid_n, tl.sum(of * of, 1), mask=row_ok)


def linear_residual(a: Tensor, weight: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """(x' = x + a @ weight.T, row_sumsq): a [..., K], weight [N, K], x [..., N] (one dtype); row_sumsq [M, T]
    float32, M the rows of x', T = ceil(N / SUMSQ_TILE): column tile t's sum of x'^2 (a row's sum of squares is
    row_sumsq[m].sum())."""
    require_kernel_device(a)
    if weight.dim() != 2 or weight.stride(-1) != 1 or weight.shape[1] != a.shape[-1]:
        raise ValueError(f"weight must be [N, K={a.shape[-1]}] with contiguous rows, got {tuple(weight.shape)}")
    n = weight.shape[0]
    if x.shape[-1] != n or x.shape[:-1] != a.shape[:-1]:
        raise ValueError(f"x {tuple(x.shape)} must be the stream of the product's rows {tuple(a.shape[:-1])} x {n}")
    if len({a.dtype, weight.dtype, x.dtype}) != 1:
        raise ValueError(f"linear_residual needs one dtype, got {a.dtype}, {weight.dtype}, {x.dtype}")
    ra, rx = _rows(a), _rows(x)
    m, k = ra.shape
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    ss = torch.empty(m, triton.cdiv(n, SUMSQ_TILE), dtype=torch.float32, device=x.device)  # every entry written
    _linear_residual_kernel[_grid(m, n)](ra, weight, rx, out, ss, m, n, k, _bucket(m), ra.stride(0), weight.stride(0),
                                         rx.stride(0), out.stride(0), ss.stride(0), **_precision(weight.dtype))
    return out.view(x.shape), ss


def fold_norm(norm_weight: Tensor, weight: Tensor) -> Tensor:
    """weight [N, K] with the norm's weight [K] folded into its columns (rounded once to weight's dtype)."""
    return (weight.float() * norm_weight.float()[None, :]).to(weight.dtype)


def gate_up_silu_scaled(x: Tensor, row_sumsq: Tensor, eps: float, folded_gate_up: Tensor) -> Tensor:
    """silu(gate) * up [..., I] of [gate | up] = RMSNorm(x) @ W.T, from the un-normed stream x [..., K] and its
    sums of squares by column tile (`linear_residual`), with the norm weight folded into W (`fold_norm`)."""
    require_kernel_device(x)
    k, inter = x.shape[-1], folded_gate_up.shape[0] // 2
    if folded_gate_up.shape != (2 * inter, k) or folded_gate_up.stride(-1) != 1 or folded_gate_up.dtype != x.dtype:
        raise ValueError(f"gate/up weight must be [2I, K={k}] {x.dtype} with contiguous rows, got "
                         f"{folded_gate_up.dtype} {tuple(folded_gate_up.shape)}")
    rows = _rows(x)
    m = rows.shape[0]
    if row_sumsq.dim() != 2 or row_sumsq.shape[0] != m or row_sumsq.dtype != torch.float32:
        raise ValueError(f"row_sumsq must be float32 [{m}, tiles], got {row_sumsq.dtype} {tuple(row_sumsq.shape)}")
    act = torch.empty(m, inter, dtype=x.dtype, device=x.device)  # [M, I]
    t = row_sumsq.shape[1]
    _add_rmsnorm_gate_up_silu_kernel[_grid(m, inter)](
        rows, rows, rows, folded_gate_up, act, rows, row_sumsq, m, inter, k, _bucket(m), eps, t,
        rows.stride(0), rows.stride(0), rows.stride(0), folded_gate_up.stride(0), act.stride(0), row_sumsq.stride(0),
        HAS_DELTA=False, HAS_NORM=False, ROW_SCALE=True, NT_P=triton.next_power_of_2(t), **_precision(x.dtype))
    return act.view(*x.shape[:-1], inter)


__all__ = ["linear_residual", "fold_norm", "gate_up_silu_scaled", "SUMSQ_TILE"]
