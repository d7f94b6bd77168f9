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

Measured on an H200 (2026-12-03, docs/measurements/README.md): correct on CUDA, but slower than the gemm level it
builds on (a SmolLM2 layer's chain 21.1 vs 19.9 us at 17 rows, 27.1 vs 25.8 at 65; the whole verify(65) pass of
Qwen3-8B shapes 6.60 vs 5.64 ms): the Triton gate/up product loses more to cuBLAS than the norm kernels cost. So
the level is an option (`SPECBENCH_FUSED_LEVEL=stats`), not the default.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import autotune_kept, interpreting, require_kernel_device
from specbench.kernels.fused import qkv_rope
from specbench.kernels.row_stats import RowStats
from specbench.kernels.norm_linear import (_add_rmsnorm_gate_up_silu_kernel, _autotuned, _bucket, _dot, _grid,
                                           _precision, _program_tile, _rows, covering_row_tiles, row_configs)

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
    rows, cols, row_ok, col_ok, pid_n = _program_tile(M, N, BLOCK_M, BLOCK_N)
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


def _summed(delta: "Tensor | RowStats | None") -> Tensor | None:
    return None if isinstance(delta, RowStats) else delta


class NormStatsOps:
    """The "stats" fusion level's norm-taking ops: those of the level below (`base_*`, the gemm level's) taking a
    stream whose pending part is `RowStats`, and `output_linear`, which makes one. At 2..MAX_ROWS rows in 16-bit
    dtypes the block output products (wo, down) add the residual and leave the sums of squares, and the next
    block's input product uses them with the norm weight folded into its weight (`fold_norm`, made once per weight
    and kept here: a second copy of wqkv and the gate/up weight); elsewhere (one row, prefill, fp32, a qkv bias)
    the base ops run, on the summed stream: `base_output` too (the gemm level's matrix-vector wo at one row; the
    plain product when not given). Bound methods fill a `LayerOps`."""

    MAX_ROWS = 128

    def __init__(self, base_norm: Callable, base_linear: Callable, base_mlp: Callable, base_qkv: Callable,
                 base_output: Callable | None = None) -> None:
        self._norm, self._linear, self._mlp, self._qkv = base_norm, base_linear, base_mlp, base_qkv
        self._output = base_output
        self._folded: dict[int, tuple] = {}  # id(weight) -> (ref to weight, norm weight, versions, W')

    def folded(self, norm_weight: Tensor, weight: Tensor) -> Tensor:
        """weight with norm_weight folded in, made again if either was changed in place since (e.g. a head trained
        between evaluations); an entry goes with its weight."""
        key, versions = id(weight), (weight._version, norm_weight._version)
        hit = self._folded.get(key)
        if hit is None or hit[0]() is not weight:
            weakref.finalize(weight, self._folded.pop, key, None)
        elif hit[1] is norm_weight and hit[2] == versions:
            return hit[3]
        folded = fold_norm(norm_weight, weight)
        self._folded[key] = (weakref.ref(weight), norm_weight, versions, folded)
        return folded

    def takes(self, rows: Tensor, weight: Tensor) -> bool:
        """Whether the stats path runs for a product of these rows [..., K] and weight [N, K]."""
        m = rows.numel() // rows.shape[-1]
        return 1 < m <= self.MAX_ROWS and rows.dtype in (torch.bfloat16, torch.float16) and weight.is_contiguous()

    def output_linear(self, o: Tensor, weight: Tensor, x: Tensor) -> "tuple[Tensor, Tensor | RowStats]":
        """(stream, pending) after a block's output product o @ weight.T on the stream x."""
        if self.takes(o, weight) and x.dtype == o.dtype:
            out, ss = linear_residual(o, weight, x)
            return out, RowStats(ss)
        if self._output is not None:
            return self._output(o, weight, x)
        return x, F.linear(o, weight)

    def norm(self, x: Tensor, weight: Tensor, eps: float, delta: "Tensor | RowStats | None" = None):  # noqa: ANN201
        return self._norm(x, weight, eps, _summed(delta))

    def add_rmsnorm_linear(self, x: Tensor, delta: "Tensor | RowStats | None", norm_weight: Tensor, eps: float,
                           weight: Tensor, bias: Tensor | None = None):  # noqa: ANN201
        return self._linear(x, _summed(delta), norm_weight, eps, weight, bias)

    def add_rmsnorm_mlp(self, x: Tensor, delta: "Tensor | RowStats | None", norm_weight: Tensor, eps: float,
                        gate_up_weight: Tensor, down_weight: Tensor):  # noqa: ANN201
        if isinstance(delta, RowStats) and self.takes(x, gate_up_weight) and down_weight.is_contiguous():
            act = gate_up_silu_scaled(x, delta.sumsq, eps, self.folded(norm_weight, gate_up_weight))
            out, ss = linear_residual(act, down_weight, x)
            return RowStats(ss), out  # (pending, stream), as the base op's (y, x + delta)
        return self._mlp(x, _summed(delta), norm_weight, eps, gate_up_weight, down_weight)

    def add_rmsnorm_qkv_rope(self, x: Tensor, delta: "Tensor | RowStats | None", norm_weight: Tensor, eps: float,
                             weight: Tensor, bias: Tensor | None, cos: Tensor, sin: Tensor, n_heads: int, n_kv: int,
                             head_dim: int, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
                             q_norm: Tensor | None = None, k_norm: Tensor | None = None, qk_eps: float = 1e-6):  # noqa: ANN201
        if isinstance(delta, RowStats) and bias is None and self.takes(x, weight):
            qkv = F.linear(x, self.folded(norm_weight, weight))
            q = qkv_rope(qkv, cos, sin, n_heads, n_kv, head_dim, k_cache, v_cache, slots, q_norm, k_norm, qk_eps,
                         row_sumsq=delta.sumsq, stream_dim=x.shape[-1], stream_eps=eps)
            return q, x
        return self._qkv(x, _summed(delta), norm_weight, eps, weight, bias, cos, sin, n_heads, n_kv, head_dim,
                         k_cache, v_cache, slots, q_norm, k_norm, qk_eps)


__all__ = ["linear_residual", "fold_norm", "gate_up_silu_scaled", "RowStats", "NormStatsOps", "SUMSQ_TILE"]
