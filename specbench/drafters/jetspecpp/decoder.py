"""The training-free decoder (methods.md §5.1 item 5): the target's own layers above the top tapped
layer, its final norm and LM head, reading (predicted) top-tap states of a block.

It owns no weights: `layers` are the target's `DecoderLayer` objects, run through their own forward
with a KV cache of their own. The verified context enters as keys/values: every committed position's
true top-tap state is run once through the upper layers (`extend`), which writes exactly the K/V the
target's own forward holds at those layers (the upper layers see the context only through them). A
block read (`read`) runs the block's states at positions committed + depth with the given
within-block mask; its K/V go to the free slots after the committed ones and are never kept (the
next extend or read overwrites them), so the cache needs `block_size` spare slots. `write` is
`extend` for the device round: the accepted rows padded to a fixed count, the length on the device.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from specbench.kernels.masks import pack_tree_mask
from specbench.models.decoder import AttentionFn, AttentionMeta, DecoderLayer, KVCache, Transformer, sdpa_attention
from specbench.models.target import TargetModel


def cached_layers(layers: Sequence[DecoderLayer], cache: KVCache, x: Tensor, rope: tuple[Tensor, Tensor], slots: Tensor,
                  meta: AttentionMeta, model: Transformer, attend: AttentionFn | None = None) -> tuple[Tensor, Tensor | None]:
    """Rows x [1, Q, d] through decoder layers over `cache` (layer i = cache layer i): their K/V written at
    `slots` [1, Q], attention as `meta` plans, cos/sin `rope`, the model's layer ops -> the last layer's
    residual stream (x, delta) (`DecoderLayer.step`: the output is their sum; delta None without layers).
    attend: the backend (None: the target's own, on CUDA its tree-attention kernel, which reads the
    committed slots and the rows' own; SDPA where `meta` carries a dense mask). SDPA over a dense mask
    reads every slot up to kv_len, the whole cache in the device round: ~43 us a layer over 2,048 slots
    on the H200 (bf16, profiled), where the kernel takes ~4 us."""
    if attend is None:
        attend = sdpa_attention if meta.dense_mask is not None else model.attend
    x, delta = x.to(model.embed.weight.dtype), None
    for i, layer in enumerate(layers):
        x, delta = layer.step(x, delta, *rope, cache.k[i], cache.v[i], slots, meta, attend, model.ops)
    return x, delta


def write_layers(layers: Sequence[DecoderLayer], cache: KVCache, x: Tensor, rope: tuple[Tensor, Tensor], slots: Tensor,
                 meta: AttentionMeta, model: Transformer) -> None:
    """`cached_layers` for the K/V it writes only (committed positions entering the cache): the last
    layer stops after its K/V projection (norm, qkv, RoPE, the cache write), since nothing reads its
    attention or MLP output. The K/V written are `cached_layers`' exactly (the same ops on the same
    inputs); a commit skips one layer's attention, output projection and MLP (7 launches on CUDA)."""
    if not layers:
        return
    x, delta = cached_layers(layers[:-1], cache, x, rope, slots, meta, model)
    last, i = layers[-1], len(layers) - 1
    last.project_heads(x, delta, *rope, cache.k[i], cache.v[i], slots, model.ops)  # the layer's own op: the same K/V


class SliceDecoder:
    """p̂(·|j) for block rows from top-tap states: layers top+1 .. L-1, final norm, LM head."""

    def __init__(self, target: TargetModel, top: int, max_seq_len: int) -> None:
        cfg = target.config
        if not 0 <= top < cfg.num_layers:
            raise ValueError(f"the decoder's top tap {top} is outside the target's {cfg.num_layers} layers")
        self.model = target.model
        self.top = top
        self.layers = list(self.model.layers[top + 1:])
        self.cache = KVCache(len(self.layers), 1, cfg.num_kv_heads, max_seq_len, cfg.head_dim, target.dtype, target.device)
        self._causal: dict[int, tuple[Tensor, Tensor]] = {}  # rows -> (causal mask [1, P, P], its packed bits)

    def causal_meta(self, p: int, kv_len: int) -> AttentionMeta:
        """The plan of a commit of p rows (causal among themselves) over the committed ones: the mask and
        the tree-attention kernel's packed bits depend on p only, so they are built once (in the eager
        round) and every commit reuses them, where each one built and packed them again (~9 launches)."""
        if p not in self._causal:
            causal = torch.ones(p, p, dtype=torch.bool, device=self.cache.k.device).tril_()[None]  # [1, P, P]
            self._causal[p] = (causal, pack_tree_mask(causal))
        causal, bits = self._causal[p]
        return AttentionMeta(lengths=self.cache.lengths, tree_mask=causal, kv_len=kv_len, tree_bits=bits)

    @property
    def length(self) -> int:
        """Committed positions whose upper-layer K/V the cache holds."""
        return self.cache.host_lengths[0]

    def reset(self) -> None:
        self.cache.reset()

    def run_layers(self, h: Tensor, positions: Tensor, within: Tensor, kv_len: int, meta: AttentionMeta | None = None,
             rope: tuple[Tensor, Tensor] | None = None, slots: Tensor | None = None,
             kv_only: bool = False) -> tuple[Tensor, Tensor | None] | None:
        """h [1, Q, d] at positions [1, Q] with within-block mask [Q, Q], reading `kv_len` cache slots ->
        the last layer's residual stream (x, delta) [1, Q, d] (`DecoderLayer.step`: the sum is the
        output, left to the norm after it); the rows' K/V go to slots length .. length+Q-1. `meta`: an
        attention plan of the same read over a cache of this one's length (its mask is reused); rope:
        `model.rope(positions)`, slots: those slots [1, Q], if the caller has them. kv_only: the K/V
        writes only (`write_layers`), None returned."""
        q = h.shape[1]
        cos, sin = rope if rope is not None else self.model.rope(positions)
        if slots is None:
            slots = self.cache.lengths[:, None] + torch.arange(q, device=h.device)  # [1, Q]
        if meta is None:
            meta = AttentionMeta(lengths=self.cache.lengths, tree_mask=within[None], kv_len=kv_len)
        if kv_only:
            write_layers(self.layers, self.cache, h, (cos, sin), slots, meta, self.model)
            return None
        return cached_layers(self.layers, self.cache, h, (cos, sin), slots, meta, self.model)

    def _host_kv_len(self, q: int) -> int:
        """Slots a host-driven call over q rows reads (a host read of the length), checked."""
        if self.length + q > self.cache.max_seq_len:
            raise RuntimeError(f"decoder cache overflow: {self.length + q} > {self.cache.max_seq_len} slots")
        return self.length + q

    def extend(self, h_top: Tensor) -> None:
        """Append committed positions: their true top-tap states h_top [1, k, d] (causal)."""
        k = h_top.shape[1]
        if k == 0:
            return
        if self.layers:
            kv_len = self._host_kv_len(k)
            meta = self.causal_meta(k, kv_len)
            self.run_layers(h_top, (self.cache.lengths[:, None] + torch.arange(k, device=h_top.device)), meta.tree_mask[0],
                            kv_len, meta, kv_only=True)
        self.cache.advance(k)

    def write(self, h_top: Tensor, count: Tensor, kv_len: int, rope: tuple[Tensor, Tensor] | None = None,
              slots: Tensor | None = None) -> None:
        """`extend` without a host read (the device round): the next committed positions' true top-tap
        states h_top [1, P, d], of which the first count [1] are real (the rest land past the new
        length, free); `kv_len` slots are read (>= length + P). slots: length .. length+P-1 [1, P] (their
        positions too) and rope `model.rope(slots)`, if the caller has them."""
        p = h_top.shape[1]
        if self.layers:
            if slots is None:
                slots = self.cache.lengths[:, None] + torch.arange(p, device=h_top.device)
            meta = self.causal_meta(p, kv_len)
            self.run_layers(h_top, slots, meta.tree_mask[0], kv_len, meta, rope, slots, kv_only=True)
        self.cache.advance_device(count)

    def truncate(self, length: int) -> None:
        """Forget the committed positions from `length` on (their K/V stay valid below it: causal)."""
        self.cache.truncate(length)

    def read(self, h_top: Tensor, depth: Tensor, within: Tensor, kv_len: int | None = None,
             meta: AttentionMeta | None = None, rope: tuple[Tensor, Tensor] | None = None,
             slots: Tensor | None = None) -> Tensor:
        """Block states h_top [1, Q, d] at positions length + depth [Q], within-block mask [Q, Q] ->
        logits [Q, V] (fp32): row j is p̂ of the token after block row j. kv_len: the slots read (None:
        length + Q, a host read; the device round passes its own, and may pass the read's attention plan
        `meta`, `rope` (`model.rope` of those positions) and the scratch `slots` [1, Q])."""
        positions = (self.cache.lengths + depth)[None] if rope is None else depth  # positions: read for RoPE only
        if kv_len is None:
            kv_len = self._host_kv_len(h_top.shape[1])
        x, delta = self.run_layers(h_top, positions, within, kv_len, meta, rope, slots) if self.layers else \
            (h_top.to(self.model.embed.weight.dtype), None)
        return self.head(x, delta)[0].float()

    def head(self, x: Tensor, delta: Tensor | None) -> Tensor:
        """The target's final norm and LM head on the residual stream x + delta [..., d] -> logits [..., V]
        (one fused op, as the target's own forward ends)."""
        m = self.model
        return m.ops.add_rmsnorm_linear(x, delta, m.norm.weight, m.norm.eps, m.lm_head.weight, None)[0]
