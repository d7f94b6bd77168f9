"""Decode attention: one new query row per head (an AR step) against the target's static KV cache.

It is `tree_attention` at N = 1, with the work split for that case. The general kernel spends 9-12 us a layer on
Qwen3-8B's step on an H200 whatever the context, several times what its 2-8 MB of K/V take at the copy rate.
This kernel drops three costs that a one-node tree does not need:

- the separate pass over the new keys under the bitmask: the step's one key sits at slot `len`, so the
  keys a query sees are the contiguous slots [0, len + bit), bit = the node's own mask bit (1 in every
  tree mask), read on the device with the length;
- the serial merge: the last split to finish (an atomic ticket per (batch, KV head), zero again after)
  merges all splits' partials for a query head in one vector load of [splits, D], not one split after
  the other;
- the general plan's floor of four key tiles per split.

Measured on the H200 (2026-12-03, docs/measurements/README.md), it is not faster: SmolLM2's layer 6.39 us at
32 splits against the general kernel's 6.74 (but flat over the context where the other grows), Qwen3-8B's
10.88 us at 16 splits against 10.78, and the AR step back to back equal (SmolLM2) or 0.18 ms slower (Qwen3-8B,
at the then-plan's 35 splits). So the floor of a decode layer is not the merge; `triton-decode` stays an
option that the pipeline picks only where its step times faster. The plan takes about one program per SM,
rounded down to a power of two splits (the merge's vector load pads to one: 35 splits ran 7.32 us where 32
ran 6.39 on SmolLM2), which gives the best configs of both shapes (16 and 32 splits on 132 SMs).

The query heads of a KV head group share its K/V tiles (rows = group, padded to 16 for the dot). Row
lengths are read on the device: no host sync, capturable. Softmax is online, in fp32 (base 2). The
reference is `reference.tree_attention_reference` at N = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import interpreting, num_sms
from specbench.kernels.tree_attention import LOG2E, _attend_range, _check

MAX_SPLITS = 64


@triton.jit
def _decode_attention_kernel(
    Q, K, V, Lengths, Bits, Out, OPart, LsePart, Counters,
    stride_qb, stride_qh,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_bb,
    stride_ob, stride_oh,
    HKV, num_splits, qk_scale,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr,
    SPLITS_P2: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
):
    split = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // HKV
    hkv = pid_bh % HKV
    g = tl.arange(0, BLOCK_M)  # [M] query head within the group
    row_ok = g < GROUP
    d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + (hkv * GROUP + g)[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None], other=0.0)  # [M, D]

    # keys [0, len) of the prefix and the step's own key at slot len, if its mask bit is set
    n_keys = tl.load(Lengths + b).to(tl.int32) + (tl.load(Bits + b * stride_bb) & 1)
    chunk = tl.cdiv(tl.cdiv(n_keys, num_splits), BLOCK_S) * BLOCK_S
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n_keys)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    m_i, l_i, acc = _attend_range(q, K + b * stride_kb + hkv * stride_kh, V + b * stride_vb + hkv * stride_vh,
                                  stride_ks, stride_vs, lo, hi, d, m_i, l_i, acc, qk_scale, BLOCK_S, IEEE, UPCAST)

    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    part = (pid_bh * num_splits + split) * GROUP + g  # [M]
    tl.store(OPart + part[:, None] * D + d[None, :], acc, mask=row_ok[:, None])
    tl.store(LsePart + part, lse, mask=row_ok)

    tl.debug_barrier()  # every thread's partial is stored before the ticket releases it
    ticket = tl.atomic_add(Counters + pid_bh, 1, sem="acq_rel")
    if ticket == num_splits - 1:  # the last split of this (batch, KV head): the others' partials are visible
        sp = tl.arange(0, SPLITS_P2)
        sp_ok = sp < num_splits
        for i in tl.static_range(GROUP):  # one query head at a time: [splits] weights, [splits, D] partials
            rows = (pid_bh * num_splits + sp) * GROUP + i  # [P]
            lse_s = tl.load(LsePart + rows, mask=sp_ok, other=float("-inf"), cache_modifier=".cg")
            o_s = tl.load(OPart + rows[:, None] * D + d[None, :], mask=sp_ok[:, None], other=0.0,
                          cache_modifier=".cg")  # [P, D]
            m = tl.max(lse_s, 0)
            m_safe = tl.where(m == float("-inf"), 0.0, m)  # no key at all: the output is 0
            w = tl.exp2(lse_s - m_safe)  # [P]
            wsum = tl.sum(w, 0)
            o = tl.sum(w[:, None] * o_s, 0) / tl.where(wsum > 0, wsum, 1.0)  # [D]
            tl.store(Out + b * stride_ob + (hkv * GROUP + i) * stride_oh + d, o.to(Out.dtype.element_ty))
        tl.atomic_xchg(Counters + pid_bh, 0)  # zero again for the next launch


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape: keys per tile, warps, pipeline depth, splits of the prefix."""

    block_s: int
    num_warps: int
    num_stages: int
    num_splits: int


def plan_decode(batch: int, kv_heads: int, context_hint: int, device: torch.device,
                dtype: torch.dtype = torch.bfloat16) -> DecodeConfig:
    """Splits of at least one key tile over the longest context (`context_hint` + the step's key), at most
    `MAX_SPLITS` and about one program per SM, rounded down to a power of two (the module docstring says why)."""
    block_s, warps, stages = (32, 4, 1) if dtype == torch.float32 else (64, 4, 3)
    tiles = triton.cdiv(context_hint + 1, block_s)
    most = max(1, min(tiles, MAX_SPLITS, triton.cdiv(num_sms(device), batch * kv_heads)))
    return DecodeConfig(block_s, warps, stages, 1 << (most.bit_length() - 1))


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, lengths: Tensor, tree_bits: Tensor, scale: float,
                     *, context_hint: int, split_counters: Tensor | None = None, config: DecodeConfig | None = None,
                     out: Tensor | None = None) -> Tensor:
    """`tree_attention` for N = 1: q [B, H, 1, D]; k_cache/v_cache [B, Hkv, S, D] with the step's K/V at slot
    lengths[b]; tree_bits [B, 1, W] (bit 0: the node sees its own key); inputs are checked as
    `tree_attention`'s. `split_counters`: int32 zeros, >= B x Hkv, kept by the caller across calls in stream
    order (zero again when the call ends); None allocates zeros for this call. Returns [B, H, 1, D]."""
    _check(q, {"ctx_k": k_cache, "ctx_v": v_cache}, lengths, tree_bits, 1)
    b, h, n, d = q.shape
    hkv = k_cache.shape[1]
    if n != 1:
        raise ValueError(f"decode_attention takes one query row per head, got N={n}: use tree_attention")
    cfg = config or plan_decode(b, hkv, context_hint, q.device, q.dtype)
    if not 1 <= cfg.num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {cfg.num_splits}")
    if split_counters is None:
        split_counters = torch.zeros(b * hkv, dtype=torch.int32, device=q.device)
    elif split_counters.dtype != torch.int32 or split_counters.device != q.device \
            or split_counters.numel() < b * hkv:
        raise ValueError(f"split_counters must be int32 on {q.device} with >= {b * hkv} entries, got "
                         f"{split_counters.dtype} [{split_counters.numel()}] on {split_counters.device}")
    if q.stride(3) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty(b, n, h, d, dtype=q.dtype, device=q.device).transpose(1, 2)  # [B, H, 1, D] view
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(3) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype} with stride 1 in the head dim")
    group = h // hkv
    o_part = torch.empty(b * hkv, cfg.num_splits, group, d, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(b * hkv, cfg.num_splits, group, dtype=torch.float32, device=q.device)
    _decode_attention_kernel[(cfg.num_splits, b * hkv)](
        q, k_cache, v_cache, lengths, tree_bits, out, o_part, lse_part, split_counters,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        tree_bits.stride(0),
        out.stride(0), out.stride(1),
        hkv, cfg.num_splits, scale * LOG2E,
        GROUP=group, D=d, BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_S=cfg.block_s,
        SPLITS_P2=max(2, triton.next_power_of_2(cfg.num_splits)), IEEE=q.dtype == torch.float32,
        UPCAST=interpreting() and q.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


__all__ = ["DecodeConfig", "plan_decode", "decode_attention", "MAX_SPLITS"]
