"""The `triton` attention backends of the native decoder: the tree-attention kernel on the static cache.

`triton` takes the kernel's plan as it is; `triton-merge` and `triton-split-merge` force where the splits of
the prefix merge (in the attention kernel's last split, or in the merge kernel after it), so both can be timed
in one run (scripts/bench_step.py) whichever one the plan picks (`FUSED_MERGE_MAX_NODES`). `triton-decode` runs
a one-node forward (the AR step) on the decode kernel (`kernels/decode_attention.py`) and every other on `triton`'s.

The tree mask is packed into the kernel's bitmask once per forward (on the first layer; one launch on CUDA,
`kernels/pack_bits.py`) and kept on the shared AttentionMeta, so the other layers reuse it; nothing here reads
the device.
"""

from __future__ import annotations

from torch import Tensor

from specbench.kernels.decode_attention import decode_attention
from specbench.kernels.pack_bits import pack_bits
from specbench.kernels.tree_attention import tree_attention
from specbench.models.decoder import AttentionMeta


def _tree_bits(meta: AttentionMeta) -> Tensor:
    if meta.tree_bits is None:
        meta.tree_bits = pack_bits(meta.tree_mask)  # [B, N, W] int32
    return meta.tree_bits


def triton_tree_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta, scale: float,
                          fused_merge: bool | None = None) -> Tensor:
    """q [B, H, N, D]; k_cache, v_cache [B, Hkv, S, D] with the new K/V at slots [len, len + N)."""
    bits = _tree_bits(meta)
    return tree_attention(q, k_cache, v_cache, meta.lengths, bits, scale, kv_len=meta.kv_len,
                          split_counters=meta.split_counters, fused_merge=fused_merge)


def triton_tree_attention_merged(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta,
                                 scale: float) -> Tensor:
    """`triton` with the splits merged in the attention kernel (no merge kernel)."""
    return triton_tree_attention(q, k_cache, v_cache, meta, scale, fused_merge=True)


def triton_tree_attention_split_merge(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta,
                                      scale: float) -> Tensor:
    """`triton` with the splits merged by the merge kernel after the attention kernel."""
    return triton_tree_attention(q, k_cache, v_cache, meta, scale, fused_merge=False)


def triton_decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta, scale: float) -> Tensor:
    """`triton`, with a one-node forward on the decode kernel (its split over the whole cache, as `triton`'s)."""
    if q.shape[2] != 1:
        return triton_tree_attention(q, k_cache, v_cache, meta, scale)
    return decode_attention(q, k_cache, v_cache, meta.lengths, _tree_bits(meta), scale,
                            context_hint=max(meta.kv_len - 1, 0), split_counters=meta.split_counters)
