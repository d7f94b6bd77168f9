"""KV compaction after acceptance: the accepted nodes' K/V move to the front of the appended block.

For each batch row b, slot base[b] + path[b, p] -> base[b] + p, in every layer and KV head, K and V,
in one launch (one program per (layer, row, KV head)). In place is safe: the path increases, so
path[p] >= p (a destination never lies after its source), and each program owns its slab. Inside a
program a chunk of rows is loaded completely (barrier) before any of it is stored; a later chunk
reads only slots >= its own destinations, which no earlier chunk wrote.
Padding (-1) and rows already in place (path[p] == p) are skipped, so it takes the path straight
from tree_accept with no host sync.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device


@triton.jit
def _kv_compact_kernel(K, V, Path, Base, P_MAX, HKV, B,
                       stride_kl, stride_kb, stride_kh, stride_ks,
                       stride_vl, stride_vb, stride_vh, stride_vs,
                       stride_p,
                       D: tl.constexpr, BLOCK_P: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)  # (layer, row, head), head fastest
    h = pid % HKV
    b = (pid // HKV) % B
    layer = pid // (HKV * B)
    base = tl.load(Base + b).to(tl.int64)
    k_slab = K + layer * stride_kl + b * stride_kb + h * stride_kh + base * stride_ks
    v_slab = V + layer * stride_vl + b * stride_vb + h * stride_vh + base * stride_vs
    d = tl.arange(0, D)
    for p0 in range(0, P_MAX, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        src = tl.load(Path + b * stride_p + p, mask=p < P_MAX, other=-1)
        move = (src >= 0) & (src != p)
        k = tl.load(k_slab + src[:, None] * stride_ks + d[None, :], mask=move[:, None])
        v = tl.load(v_slab + src[:, None] * stride_vs + d[None, :], mask=move[:, None])
        tl.debug_barrier()  # every load of this chunk before any store
        tl.store(k_slab + p[:, None] * stride_ks + d[None, :], k, mask=move[:, None])
        tl.store(v_slab + p[:, None] * stride_vs + d[None, :], v, mask=move[:, None])


def kv_compact(k: Tensor, v: Tensor, path: Tensor, base: Tensor) -> None:
    """In place: k, v [L, B, Hkv, S, D]; path [B, P] (or [P] for B = 1) increasing node ids relative to
    the appended block, -1 = padding; base [B] (device) = the committed length the block starts at.
    The caller keeps base + number of valid path entries <= S (the cache's overflow check)."""
    if k.dim() != 5 or k.shape != v.shape or k.dtype != v.dtype:
        raise ValueError(f"k and v must be matching [L, B, Hkv, S, D] tensors, got {tuple(k.shape)} and {tuple(v.shape)}")
    require_kernel_device(k)
    layers, b, hkv, _, d = k.shape
    if path.dim() == 1:
        path = path[None]
    if path.dim() != 2 or path.shape[0] != b or base.shape != (b,):
        raise ValueError(f"path must be [B={b}, P] and base [B={b}], got {tuple(path.shape)} and {tuple(base.shape)}")
    if k.stride(4) != 1 or v.stride(4) != 1 or d & (d - 1):
        raise ValueError("the head dim must be contiguous and a power of two")
    path = path.contiguous()
    p_max = path.shape[1]
    _kv_compact_kernel[(layers * b * hkv,)](
        k, v, path, base, p_max, hkv, b,
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3),
        path.stride(0),
        D=d, BLOCK_P=16, num_warps=4,
    )
