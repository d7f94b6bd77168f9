"""A native Llama / Qwen2 / Qwen3 decoder with a preallocated static KV cache, in the gpt-fast spirit.

One forward serves prefill, plain decoding and tree verification: N new tokens are appended to the
cache at slots [len, len + N) of each row; each new token attends to the whole committed prefix
[0, len) and to the new tokens its `tree_mask` row allows (causal for a chain, ancestors for a tree).
Positions are passed explicitly (a tree node's position is committed length + depth).

The attention backend is pluggable (`ATTENTION_BACKENDS`): `sdpa` is the PyTorch reference with a
dense boolean mask over the cache; the Triton tree-attention kernel plugs in beside it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from specbench.kernels.reference import (add_rmsnorm_linear_reference, add_rmsnorm_mlp_reference,
                                        add_rmsnorm_qkv_rope_reference, output_linear_reference, qkv_rope_reference,
                                        rmsnorm_reference, silu_mul_reference)
from specbench.kernels.row_stats import RowStats
from specbench.models.config import ModelConfig


# --------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------
class KVCache:
    """Static K/V buffers for every layer, plus the committed length of each batch row.

    k, v: [L, B, H_kv, S, D]. `lengths` [B] (device, int64) is what the forward reads, so a captured
    graph can replay with new lengths; `host_lengths` mirrors it on the host for bookkeeping (read back
    from the device only after a device-side commit).
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (num_layers, batch, num_kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self._host: list[int] | None = [0] * batch
        self.max_seq_len = max_seq_len
        # tree attention's merge tickets (zero between its launches, which this cache's forwards issue in
        # stream order): room for 64 row tiles per (row, KV head)
        self.split_counters = torch.zeros(batch * num_kv_heads * 64, dtype=torch.int32, device=device)
        self._rope: dict[torch.dtype, tuple[Tensor, Tensor]] = {}  # `rope`'s tables, per dtype

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def host_lengths(self) -> list[int]:
        if self._host is None:  # stale after commit_packed: one read
            self._host = [int(n) for n in self.lengths.tolist()]
        return self._host

    @host_lengths.setter
    def host_lengths(self, values: list[int]) -> None:
        self._host = list(values)

    def rows(self, rows: slice) -> "KVCache":
        """Batch rows `rows` as a cache of their own: views of this one's K/V and lengths (writes to either
        are seen by both)."""
        out = object.__new__(KVCache)
        out.k, out.v, out.lengths = self.k[:, rows], self.v[:, rows], self.lengths[rows]
        out._host, out.max_seq_len, out.split_counters = None, self.max_seq_len, self.split_counters
        out._rope = self._rope
        return out

    def rope(self, positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin [B, N, 1, D] of `positions` [B, N] (each < max_seq_len: a position the cache has a slot
        for), gathered from tables of every slot's `rope_angles`: two gathers where computing them is seven
        kernels a forward, bitwise the values computed at the positions (element-wise ops compute each element
        alike whatever the shape: tested on the CPU and CUDA), so a pass given computed angles (the jetspec++
        tap stack) agrees exactly with one reading its cache. A cache serves one model's RoPE (inv_freq); the
        tables are built on the first call, which the engine makes eagerly (the prefill) before any graph
        capture, so captured passes read them in place."""
        tables = self._rope.get(dtype)
        if tables is None:
            tables = rope_angles(torch.arange(self.max_seq_len, device=inv_freq.device), inv_freq, dtype)
            self._rope[dtype] = tables
        cos, sin = tables  # [S, D]
        return cos[positions][:, :, None, :], sin[positions][:, :, None, :]

    def reset(self) -> None:
        self.lengths.zero_()
        self._host = [0] * self.batch

    def advance(self, count: int, row: int = 0) -> None:
        """The `count` appended tokens of `row` are all kept in place (prefill, or an accepted chain)."""
        self.lengths[row] += count
        self.host_lengths[row] += count

    def advance_all(self, count: int) -> None:
        """Every row keeps its `count` appended tokens (batched decoding: one token per row per step)."""
        self.lengths += count
        if self._host is not None:
            self._host = [n + count for n in self._host]

    def advance_device(self, count: Tensor, row: int = 0) -> None:
        """`advance` by count [1], a device tensor (no host read; host_lengths is read back on demand)."""
        self.lengths[row: row + 1].add_(count)  # one in-place add (`lengths[row] += ...` copies the view back)
        self._host = None

    def commit(self, path: Sequence[int] | Tensor, row: int = 0) -> None:
        """Keep the appended nodes `path` (indices into the last forward's N new tokens, increasing,
        starting with the root 0) as the next causal prefix of `row`: their K/V move to slots
        [len, len + P) and len grows by P. Unkept appended slots become free."""
        base = self.host_lengths[row]
        if isinstance(path, Sequence) and list(path) == list(range(len(path))):
            if base + len(path) > self.max_seq_len:
                raise RuntimeError(f"KV cache overflow: {base + len(path)} > max_seq_len {self.max_seq_len}")
            return self.advance(len(path), row)  # a prefix of the appended block: nothing moves
        p = torch.as_tensor(path, dtype=torch.long, device=self.k.device)
        count = int(p.numel())
        if count == 0:
            return
        if base + count > self.max_seq_len:
            raise RuntimeError(f"KV cache overflow: {base + count} > max_seq_len {self.max_seq_len}")
        host = list(self.host_lengths)
        self.commit_packed(p, torch.full((1,), count, dtype=torch.long, device=self.k.device), row)
        host[row] = base + count
        self._host = host

    def commit_packed(self, path: Tensor, count: Tensor, row: int = 0) -> None:
        """`commit` without a host read: path [P] node ids padded with -1, count [1] the valid ones, both
        on the cache's device (what `Acceptance` holds). Slots past the new length may receive padding
        rows' K/V: they are free. The caller keeps len + N <= S (the forward already wrote there)."""
        (self.compact_with_kernel if self.k.is_cuda else self.compact_with_index_ops)(path, row)
        self.advance_device(count, row)

    def compact_with_kernel(self, path: Tensor, row: int = 0) -> None:
        """The path's K/V moved to the row's prefix (before the length grows): one Triton launch for all
        layers, K and V (in place: dst <= src). CUDA (or the Triton interpreter)."""
        from specbench.kernels.kv_compact import kv_compact

        if self.batch == 1:  # the kernel takes the path itself
            kv_compact(self.k, self.v, path, self.lengths)
            return
        rows = torch.full((self.batch, path.numel()), -1, dtype=torch.long, device=path.device)
        rows[row] = path
        kv_compact(self.k, self.v, rows, self.lengths)  # the lengths are the base slots: grow after

    def compact_with_index_ops(self, path: Tensor, row: int = 0) -> None:
        """`compact_with_kernel` by index ops (any device, no host read)."""
        base = self.lengths[row]
        src = base + path.clamp(min=0)
        dst = base + torch.arange(path.numel(), device=path.device)
        for buf in (self.k, self.v):  # all layers at once; index_select copies before the write
            buf[:, row].index_copy_(2, dst, buf[:, row].index_select(2, src))

    def truncate(self, length: int, row: int = 0) -> None:
        """Forget everything after `length` tokens of `row`."""
        self.lengths[row] = length
        self.host_lengths[row] = length


def attention_mask(lengths: Tensor, tree_mask: Tensor, kv_len: int) -> Tensor:
    """Dense boolean mask [B, 1, N, kv_len]: new token i of row b sees slot s iff s < len[b] (committed
    prefix) or s = len[b] + j with tree_mask[b, i, j]. Built on the device: no host sync."""
    b, n, _ = tree_mask.shape
    slots = torch.arange(kv_len, device=tree_mask.device)
    prefix = slots[None, :] < lengths[:, None]  # [B, kv]
    rel = slots[None, :] - lengths[:, None]  # [B, kv]: index among the new tokens
    in_new = (rel >= 0) & (rel < n)
    gathered = tree_mask.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(b, n, kv_len))  # [B, N, kv]
    return (prefix[:, None, :] | (gathered & in_new[:, None, :]))[:, None]


# --------------------------------------------------------------------------------------------
# Attention backends: (q [B,H,N,D], k_cache [B,Hkv,S,D], v_cache, meta) -> [B,H,N,D]
# --------------------------------------------------------------------------------------------
@dataclass
class AttentionMeta:
    """Host-side planning shared by every layer of one forward (flashinfer's plan/run split)."""

    lengths: Tensor  # [B] committed length per row
    tree_mask: Tensor  # [B, N, N] bool
    kv_len: int  # cache slots the kernel reads: >= max(len) + N
    dense_mask: Tensor | None = None  # [B, 1, N, kv_len], built lazily by the sdpa backend
    tree_bits: Tensor | None = None  # [B, N, ceil(N/32)] int32 packed tree mask, built by the triton backend
    split_counters: Tensor | None = None  # the cache's int32 workspace for the triton backend's fused merge

    def rows(self, n: int) -> "AttentionMeta":
        """This plan for its first n batch rows, what a backend already built for it sliced, not rebuilt
        (itself when n is its batch: what the backend builds then stays here for the others)."""
        if n == self.lengths.shape[0]:
            return self
        return AttentionMeta(self.lengths[:n], self.tree_mask[:n], self.kv_len,
                             None if self.dense_mask is None else self.dense_mask[:n],
                             None if self.tree_bits is None else self.tree_bits[:n], self.split_counters)


# On Hopper PyTorch may pick cuDNN for masked attention. cuDNN builds an execution plan per distinct
# shape, which costs milliseconds: harmless for the CUDA-graph verify forward (one shape, read over the
# whole cache), ruinous for eager calls whose context grows every round (each draft-head pass, each
# self-draft step). Measured on an H200 (bf16, SmolLM2, scripts/profile_round.py): dflash/ddtree/64
# draft 11.4 -> 4.6 ms/round, eagle3/eagle2/64 228 -> 26 ms/round with cuDNN kept off eager calls.
# SPECBENCH_SDPA_CUDNN=1 leaves every call to PyTorch's own choice (to measure the difference).
EAGER_MASKED_SDPA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
_CUDNN_EVERYWHERE = os.environ.get("SPECBENCH_SDPA_CUDNN") == "1"


def expand_gqa(k: Tensor, v: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """K/V [B, Hkv, S, D] with each head repeated to `heads` (query head h reads K/V head h // (heads / Hkv),
    as SDPA's enable_gqa does): for the kernels that take a mask but no GQA broadcast."""
    rep = heads // k.shape[1]
    return (k, v) if rep == 1 else (k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1))


def masked_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, *, static_shape: bool = False) -> Tensor:
    """F.scaled_dot_product_attention with a boolean mask: q [B, H, N, D], k/v [B, Hkv, S, D], mask
    broadcastable to [B, H, N, S]. static_shape: the same shapes recur (a captured forward over the
    whole cache), so PyTorch's backend choice stands; otherwise `EAGER_MASKED_SDPA_BACKENDS`.
    Training on CUDA (a grad to take) repeats the K/V heads: the memory-efficient kernel takes a mask but no
    GQA broadcast, so enable_gqa with a mask leaves only the math path, whose batched products and saved
    [B, H, N, S] scores were ~28 % of the H200's training step (2026-12-03, docs/measurements/README.md)."""
    gqa = q.shape[1] != k.shape[1]
    if static_shape or _CUDNN_EVERYWHERE or q.device.type != "cuda":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    if gqa and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        k, v = expand_gqa(k, v, q.shape[1])
        gqa = False
    with sdpa_kernel(list(EAGER_MASKED_SDPA_BACKENDS)):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


def sdpa_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta, scale: float) -> Tensor:
    if meta.dense_mask is None:
        meta.dense_mask = attention_mask(meta.lengths, meta.tree_mask, meta.kv_len)
    whole_cache = meta.kv_len == k_cache.shape[2]  # the CUDA-graph path: one shape for every call
    return masked_sdpa(q, k_cache[:, :, : meta.kv_len], v_cache[:, :, : meta.kv_len], meta.dense_mask, scale,
                       static_shape=whole_cache)


AttentionFn = Callable[[Tensor, Tensor, Tensor, AttentionMeta, float], Tensor]
ATTENTION_BACKENDS: dict[str, str | AttentionFn] = {
    "sdpa": sdpa_attention,
    "triton": "specbench.models.triton_attention:triton_tree_attention",
    "triton-merge": "specbench.models.triton_attention:triton_tree_attention_merged",
    "triton-split-merge": "specbench.models.triton_attention:triton_tree_attention_split_merge",
    "triton-decode": "specbench.models.triton_attention:triton_decode_attention",
}


def is_triton_backend(name: str) -> bool:
    """Whether backend `name` runs the tree-attention kernel (drafters then use the kernel's packed masks)."""
    return name == "triton" or name.startswith("triton-")


def get_attention_backend(name: str) -> AttentionFn:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(ATTENTION_BACKENDS)}")
    fn = ATTENTION_BACKENDS[name]
    if isinstance(fn, str):
        from specbench.registry import import_dotted

        fn = import_dotted(fn)
    return fn  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rmsnorm_reference(x, self.weight, self.eps)[0]


def rope_angles(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [...] -> cos, sin [..., D] of rotate-half RoPE (inv_freq [D/2]), computed in fp32, cast to dtype."""
    freqs = positions[..., None].float() * inv_freq  # [..., D/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype,
                 cache: KVCache | None = None) -> tuple[Tensor, Tensor]:
    """positions [B, N] -> cos, sin [B, N, 1, D] in dtype: gathered from the cache's tables (`KVCache.rope`)
    when a pass has its cache, else computed (`rope_angles`); the same values either way. What the
    target's and the draft heads' passes share."""
    if cache is not None:
        return cache.rope(positions, inv_freq, dtype)
    cos, sin = rope_angles(positions, inv_freq, dtype)
    return cos[:, :, None, :], sin[:, :, None, :]


def rope_inv_freq(cfg: ModelConfig) -> Tensor:
    """Inverse frequencies [D/2] for the config's RoPE type (default, linear, llama3)."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    sc = cfg.rope_scaling
    if not sc:
        return inv
    kind = sc.get("rope_type", sc.get("type"))
    if kind == "linear":
        return inv / float(sc["factor"])
    if kind == "llama3":
        factor, lo, hi = float(sc["factor"]), float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
        old = float(sc["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= old / hi) & (wavelen <= old / lo)
        return torch.where(is_mid, mid, scaled)
    raise ValueError(f"RoPE type {kind!r} is not supported (supported: default, linear, llama3)")


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, N, H, D]; cos/sin [B, N, 1, D] (rotate-half convention of HF checkpoints)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


@dataclass(frozen=True)
class LayerOps:
    """The element-wise work of a layer, alone or fused into the matrix product after it. `REFERENCE_OPS`
    are plain PyTorch (the CPU path, and what the kernels are tested against); `fused_ops(level)` are
    Triton kernels for CUDA (one launch each instead of several).

    norm(x, weight, eps, delta) -> (RMSNorm(x + delta) * weight, x + delta)
    qkv_rope(qkv, cos, sin, H, Hkv, D, k_cache, v_cache, slots, q_norm, k_norm, eps) -> q [B, H, N, D]
    silu_mul(gate_up) -> silu(gate) * up
    add_rmsnorm_linear(x, delta, norm_weight, eps, weight, bias) -> (F.linear(norm(x + delta), weight, bias), x + delta)
    add_rmsnorm_mlp(x, delta, norm_weight, eps, w_gate_up, w_down) -> (F.linear(silu_mul(F.linear(norm(x + delta),
        w_gate_up)), w_down), x + delta): the MLP block on the residual stream
    add_rmsnorm_qkv_rope(x, delta, norm_weight, eps, wqkv, bias, cos, sin, H, Hkv, D, k_cache, v_cache, slots, q_norm,
        k_norm, qk_eps) -> (qkv_rope(add_rmsnorm_linear(...)), x + delta): the attention block's input
    output_linear(o, weight, x) -> (x, F.linear(o, weight)): a block's output product, its residual add pending

    The residual stream between ops is a pair (x, pending), the stream being x + pending (`residual_sum`): pending
    is None, the delta still to add, or at the "stats" level `RowStats` (x is the whole stream, and pending holds
    its rows' sums of squares for the next norm; `specbench.kernels.norm_stats`). Every op taking a delta takes any.
    """

    norm: Callable[..., tuple[Tensor, Tensor]]
    qkv_rope: Callable[..., Tensor | None]
    silu_mul: Callable[[Tensor], Tensor]
    add_rmsnorm_linear: Callable[..., tuple[Tensor, Tensor]]
    add_rmsnorm_mlp: Callable[..., tuple[Tensor, Tensor]]
    add_rmsnorm_qkv_rope: Callable[..., tuple[Tensor, Tensor]]
    output_linear: Callable[..., tuple[Tensor, Any]] = output_linear_reference


def residual_sum(x: Tensor, pending: Any) -> Tensor:
    """The residual stream of a pair (x, pending) (`LayerOps`)."""
    return x if pending is None or isinstance(pending, RowStats) else x + pending


REFERENCE_OPS = LayerOps(rmsnorm_reference, qkv_rope_reference, silu_mul_reference, add_rmsnorm_linear_reference,
                         add_rmsnorm_mlp_reference, add_rmsnorm_qkv_rope_reference)
FUSED_LEVELS = ("reference", "elementwise", "gemm", "stats")
# The default on CUDA (`build_model`): on an H200 the gemm level ran SmolLM2's graphed AR step in 0.994 ms
# against 1.044 for elementwise in the same run, and chose the unfused path for every Qwen3-8B shape
# (docs/measurements/README.md, "Fewer kernels").
CUDA_FUSED_LEVEL = "gemm"


def fused_ops(level: str = "elementwise") -> LayerOps:
    """The Triton ops of a fusion level: "elementwise" = the element-wise kernels of
    `specbench.kernels.fused` between cuBLAS products; "gemm" = besides those, add+RMSNorm fused into the
    product after it and the MLP's norm, gate/up product and SiLU*up in one kernel (one row: SiLU*up fused
    into the down product instead; `specbench.kernels.norm_linear`) and wqkv with its q/k-norm, RoPE and K/V
    write as the epilogue (`specbench.kernels.qkv_rope_linear`) for the few rows of decode and verify, and
    a decode step's wo on the matrix-vector kernel, each per shape only where timing on the device shows the
    fused kernel faster (`FasterPerShape`); "stats" = the gemm level with, at verify's rows, the norms'
    statistics from the products that write the stream and the norm weights folded into the products after
    them, so no RMSNorm kernel runs between layers (`specbench.kernels.norm_stats.NormStatsOps`; timed slower
    than gemm on an H200, so not the default)."""
    from specbench.kernels.fused import qkv_rope, rmsnorm, silu_mul
    from specbench.kernels import norm_linear as nl, qkv_rope_linear as ql

    if level == "elementwise":
        return LayerOps(rmsnorm, qkv_rope, silu_mul, nl.add_rmsnorm_then_linear, nl.add_rmsnorm_mlp_then_linear,
                        ql.add_rmsnorm_qkv_rope_then_split)
    if level not in ("gemm", "stats"):
        raise ValueError(f"unknown fused level {level!r}; choose one of {', '.join(FUSED_LEVELS)}")
    from specbench.kernels.per_shape import FasterPerShape

    gemm = LayerOps(rmsnorm, qkv_rope, silu_mul,
                    FasterPerShape(nl.add_rmsnorm_linear, nl.add_rmsnorm_then_linear, nl.add_rmsnorm_linear_fits,
                                   "add_rmsnorm_linear"),
                    FasterPerShape(nl.add_rmsnorm_mlp, nl.add_rmsnorm_mlp_then_linear, nl.add_rmsnorm_mlp_fits,
                                   "add_rmsnorm_mlp"),
                    FasterPerShape(ql.add_rmsnorm_qkv_rope, ql.add_rmsnorm_qkv_rope_then_split,
                                   ql.add_rmsnorm_qkv_rope_fits, "add_rmsnorm_qkv_rope"),
                    FasterPerShape(nl.output_linear, output_linear_reference, nl.output_linear_fits, "output_linear"))
    if level == "gemm":
        return gemm
    from specbench.kernels.norm_stats import NormStatsOps

    stats = NormStatsOps(gemm.norm, gemm.add_rmsnorm_linear, gemm.add_rmsnorm_mlp, gemm.add_rmsnorm_qkv_rope,
                         gemm.output_linear)  # one row: the gemm level's step exactly
    return LayerOps(stats.norm, qkv_rope, silu_mul, stats.add_rmsnorm_linear, stats.add_rmsnorm_mlp,
                    stats.add_rmsnorm_qkv_rope, stats.output_linear)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.wqkv = nn.Linear(cfg.hidden_size, q_dim + 2 * kv_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(q_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = cfg.head_dim ** -0.5

    def project(self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
                ops: LayerOps = REFERENCE_OPS) -> Tensor:
        """q [B, H, N, D] of x [B, N, d]; the new K/V are written into the caches at `slots` [B, N]."""
        return self.split_heads(self.wqkv(x), cos, sin, k_cache, v_cache, slots, ops)

    def split_heads(self, qkv: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
                    ops: LayerOps = REFERENCE_OPS) -> Tensor:
        """`project` from the projection qkv [B, N, (H + 2 Hkv) D] itself (q/k-norm, RoPE, K/V into the caches)."""
        q_norm, k_norm, eps = self.qk_norms()
        return ops.qkv_rope(qkv, cos, sin, self.n_heads, self.n_kv, self.head_dim, k_cache, v_cache, slots, q_norm,
                            k_norm, eps=eps)

    def qk_norms(self) -> tuple[Tensor | None, Tensor | None, float]:
        """(q_norm weight, k_norm weight, their eps): Qwen3's per-head norms, or (None, None, 1e-6)."""
        if self.q_norm is None:
            return None, None, 1e-6
        return self.q_norm.weight, self.k_norm.weight, self.q_norm.eps  # type: ignore[union-attr]

    def attend_projected(self, qkv: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                         slots: Tensor, meta: AttentionMeta, attend: AttentionFn, ops: LayerOps = REFERENCE_OPS) -> Tensor:
        """The attention block's output [B, N, d] from the projection qkv [B, N, (H + 2 Hkv) D]."""
        return self.attend_heads(self.split_heads(qkv, cos, sin, k_cache, v_cache, slots, ops), k_cache, v_cache,
                                 meta, attend)

    def attend_heads(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta,
                     attend: AttentionFn) -> Tensor:
        """The attention block's output [B, N, d] from q [B, H, N, D] (its K/V already in the caches)."""
        return self.wo(self.attend_rows(q, k_cache, v_cache, meta, attend))

    def attend_rows(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta,
                    attend: AttentionFn) -> Tensor:
        """The heads' attention outputs as rows [B, N, H * D], before the output projection."""
        b, _, n, _ = q.shape
        y = attend(q, k_cache, v_cache, meta, self.scale)  # [B, H, N, D]
        return y.transpose(1, 2).reshape(b, n, self.n_heads * self.head_dim)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                slots: Tensor, meta: AttentionMeta, attend: AttentionFn, ops: LayerOps = REFERENCE_OPS) -> Tensor:
        return self.attend_projected(self.wqkv(x), cos, sin, k_cache, v_cache, slots, meta, attend, ops)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w_gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.w_down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor, ops: LayerOps = REFERENCE_OPS) -> Tensor:
        return self.w_down(ops.silu_mul(self.w_gate_up(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def step(self, x: Tensor, delta: Tensor | None, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
             slots: Tensor, meta: AttentionMeta, attend: AttentionFn, ops: LayerOps = REFERENCE_OPS
             ) -> tuple[Tensor, Tensor]:
        """The layer on the residual stream (x, delta) (`LayerOps`: x + delta, or x), returned the same way, so
        each residual add is fused into the norm that follows it (and, at the "gemm" level, each norm into
        the projection after it, the MLP's element-wise work into its products; at "stats", the adds into the
        products before the norms)."""
        attn, mlp = self.attn, self.mlp
        q, x = self.project_heads(x, delta, cos, sin, k_cache, v_cache, slots, ops)
        x, a = ops.output_linear(attn.attend_rows(q, k_cache, v_cache, meta, attend), attn.wo.weight, x)
        y, x = ops.add_rmsnorm_mlp(x, a, self.mlp_norm.weight, self.mlp_norm.eps, mlp.w_gate_up.weight,
                                   mlp.w_down.weight)
        return x, y

    def project_heads(self, x: Tensor, delta: Tensor | None, cos: Tensor, sin: Tensor, k_cache: Tensor,
                      v_cache: Tensor, slots: Tensor, ops: LayerOps = REFERENCE_OPS) -> tuple[Tensor, Tensor]:
        """(q [B, H, N, D], the stream x + delta): the attention block's norm, projection, q/k norm and RoPE,
        its K/V written into the caches at `slots` (one op: at the "gemm" level one kernel after the norm's)."""
        attn = self.attn
        return ops.add_rmsnorm_qkv_rope(x, delta, self.attn_norm.weight, self.attn_norm.eps, attn.wqkv.weight,
                                        attn.wqkv.bias, cos, sin, attn.n_heads, attn.n_kv, attn.head_dim, k_cache,
                                        v_cache, slots, *attn.qk_norms())

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                slots: Tensor, meta: AttentionMeta, attend: AttentionFn, ops: LayerOps = REFERENCE_OPS) -> Tensor:
        x, delta = self.step(x, None, cos, sin, k_cache, v_cache, slots, meta, attend, ops)
        return residual_sum(x, delta)


@dataclass
class ForwardOutput:
    logits: Tensor  # [B, N', V] for the requested rows
    hidden: dict[int, Tensor]  # tap layer index -> output of that layer [B, N, d]
    final_hidden: Tensor | None = None  # [B, N, d] after the final norm (when asked)


class Transformer(nn.Module):
    """Embedding -> decoder layers -> final RMSNorm -> LM head (tied or not)."""

    def __init__(self, cfg: ModelConfig, attention: str = "sdpa") -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.attention = attention
        self._attend = get_attention_backend(attention)
        self.ops, self.fused_level = REFERENCE_OPS, "reference"
        self.register_buffer("inv_freq", rope_inv_freq(cfg).float(), persistent=False)

    @property
    def attend(self) -> AttentionFn:
        """The attention backend's function (what every layer calls; draft heads that share the target's
        cache layout call it too)."""
        return self._attend

    def set_attention(self, name: str) -> None:
        self._attend = get_attention_backend(name)
        self.attention = name

    @property
    def fused(self) -> bool:
        return self.ops is not REFERENCE_OPS

    def set_fused(self, level: str | bool) -> None:
        """The layer ops of a fusion level (`FUSED_LEVELS`): "reference" (PyTorch, any device), or the
        Triton kernels of `fused_ops(level)` (CUDA). True / False: `CUDA_FUSED_LEVEL` / "reference"."""
        if isinstance(level, bool):
            level = CUDA_FUSED_LEVEL if level else "reference"
        self.ops = REFERENCE_OPS if level == "reference" else fused_ops(level)
        self.fused_level = level

    def new_cache(self, batch: int, max_seq_len: int, num_layers: int | None = None) -> KVCache:
        cfg = self.config
        p = self.embed.weight
        return KVCache(num_layers or cfg.num_layers, batch, cfg.num_kv_heads, max_seq_len, cfg.head_dim, p.dtype, p.device)

    def rope(self, positions: Tensor, cache: KVCache | None = None) -> tuple[Tensor, Tensor]:
        """positions [B, N] -> cos, sin [B, N, 1, D] in the model dtype (computed in fp32); cache: gathered
        from its tables instead (`KVCache.rope`: positions below its max_seq_len; the same values)."""
        return rope_cos_sin(positions, self.inv_freq, self.embed.weight.dtype, cache)

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: KVCache,
        tree_mask: Tensor | None = None,
        taps: Sequence[int] = (),
        logits_rows: Tensor | str | None = None,
        num_layers: int | None = None,
        kv_len: int | None = None,
        return_final_hidden: bool = False,
    ) -> ForwardOutput:
        """Run N new tokens per row.

        tokens, positions [B, N] (positions below the cache's max_seq_len: RoPE comes from its tables);
        tree_mask [B, N, N] bool (None = causal among the new tokens);
        taps: layer indices whose outputs to return; logits_rows: None = all rows, "last" = the last
        row only, or an index tensor [N'] of rows; num_layers: run only the first layers (a
        shallow self-draft model; the cache must have that many layers); kv_len: cache slots to read
        (>= max committed length + N; None = the whole cache, graph-friendly).
        """
        b, n = tokens.shape
        if tree_mask is None:
            tree_mask = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril_()[None].expand(b, n, n)
        layers = self.layers if num_layers is None else self.layers[:num_layers]
        if cache.k.shape[0] < len(layers):
            raise ValueError(f"cache has {cache.k.shape[0]} layers, forward runs {len(layers)}")
        if kv_len is None:
            kv_len = cache.max_seq_len
        slots = cache.lengths[:, None] + torch.arange(n, device=tokens.device)  # [B, N]
        meta = AttentionMeta(lengths=cache.lengths, tree_mask=tree_mask, kv_len=kv_len,
                             split_counters=cache.split_counters)
        cos, sin = self.rope(positions, cache)
        x, delta = self.embed(tokens), None  # [B, N, d]: the residual stream is x + delta
        hidden: dict[int, Tensor] = {}
        tap_set = set(taps)
        ops = self.ops
        for i, layer in enumerate(layers):
            x, delta = layer.step(x, delta, cos, sin, cache.k[i], cache.v[i], slots, meta, self._attend, ops)
            if i in tap_set:
                hidden[i] = residual_sum(x, delta)
        missing = tap_set - set(hidden)
        if missing:
            raise ValueError(f"tap layers {sorted(missing)} are outside the {len(layers)} layers run")
        assert delta is not None
        pending = None if isinstance(delta, RowStats) else delta  # RowStats: the stream is whole, the norm takes x
        if isinstance(logits_rows, str) and logits_rows != "last":
            raise ValueError("logits_rows must be None, 'last' or an index tensor")
        rows = slice(-1, None) if isinstance(logits_rows, str) else logits_rows
        if rows is not None:
            x, pending = x[:, rows], None if pending is None else pending[:, rows]
        delta = pending
        if return_final_hidden:
            final, _ = ops.norm(x, self.norm.weight, self.norm.eps, delta)
            return ForwardOutput(logits=self.lm_head(final), hidden=hidden, final_hidden=final)
        logits, _ = ops.add_rmsnorm_linear(x, delta, self.norm.weight, self.norm.eps, self.lm_head.weight, None)
        return ForwardOutput(logits=logits, hidden=hidden)
