"""Foresight drafting (methods.md §5.2): the next block for each of B selected verification outcomes of
the block under verification, in one batched pass of the draft model per step (J0, each refresh, each
Jacobi pass).

Outcome b = (node u_b, bonus a_b) commits the tree's root and the path to u_b, so its next block
reads the verified context (positions < n) followed by those nodes' *predicted* tapped states (the
adapter's, or the stale / true ablations) at positions n + depth, and starts with anchor a_b at
position n + depth(u_b) + 1. The predicted states of every tree node are computed once per round
(they depend only on the block's tokens), so the B outcomes share one key/value set
[committed n ; tree nodes N] and differ only in which tree nodes they may see (u_b's ancestors,
a row of the tree's ancestor mask) and in their own block:

    mask[b] = [ ones(n) | ancestors(u_b) | block pattern ]            # [b_rows, n + N + b_rows]

(`slot_mask`: the same over whole caches of static size, the committed part and the tree nodes' slots
found from the committed length on the device, so the device round's foresight stage is capturable.)

The draft head reads the committed context K/V from its cache and the tree nodes' from their
predicted features; the refresh's adapter and decoder (and the `true` oracle) read their committed
K/V from their own caches and the tree nodes' from the slots the round's P̂ read (or oracle pass)
just wrote there (`SliceDecoder.read` leaves the block's K/V in the slots after the committed ones).
On true states this is exactly the critical-path draft after that outcome (tested), and on predicted
states it is the critical-path draft with the predicted states in place of the true ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from specbench.drafters.base import DraftState
from specbench.drafters.heads.backbone import DraftHead
from specbench.drafters.heads.masks import block_pattern
from specbench.drafters.jetspecpp.decoder import SliceDecoder
from specbench.models.decoder import AttentionMeta, DecoderLayer, KVCache, masked_sdpa
from specbench.trees.base import DraftTree

if TYPE_CHECKING:
    from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter


def slot_mask(slots: int, length: Tensor, ancestors: Tensor | None = None) -> Tensor:
    """[B, slots] (B = 1 without ancestors): the committed slots (< length [1]) and, with ancestors
    [B, N], tree node i at slot length + i where it is an ancestor of the outcome's node (where a block
    read left the tree's K/V). Static shapes: the device round reads whole caches."""
    s = torch.arange(slots, device=length.device)
    committed = (s < length)[None]  # [1, S]
    if ancestors is None:
        return committed
    n = ancestors.shape[1]
    node = s - length  # [S]
    in_tree = (node >= 0) & (node < n)
    placed = ancestors[:, node.clamp(0, n - 1)] & in_tree[None]  # [B, S]
    return committed | placed


@dataclass
class Context:
    """Where an outcome batch reads the committed context: `length` [1] committed positions (a device
    tensor), `slots` the leading slots of the draft head's and the adapter's caches it reads (those
    at or past length are masked out), `tree_slots` the decoder's (the tree nodes' K/V at length +
    node), the top tap adapter's committed K/V per layer (`slots` wide) and the decoder. The host
    round reads exactly the filled slots (`host_context`); the device round whole caches. nodes: the
    tree nodes' positions [1, N] (length + depth) and their cos/sin, if the caller has them (the P̂
    read's plan)."""

    length: Tensor
    slots: int
    tree_slots: int
    adapter_kv: list[tuple[Tensor, Tensor]] | None
    decoder: SliceDecoder | None
    nodes: tuple[Tensor, tuple[Tensor, Tensor]] | None = None


def host_context(drafter: "JetSpecPPDrafter", state: DraftState, tree: DraftTree) -> Context:
    """The host round's context: the committed positions of `state`, the drafter's host-side caches."""
    n = state.cache_len
    kv = drafter.adapter_caches[drafter.top].kv() if drafter.adapter_caches else None
    return Context(length=torch.full((1,), n, dtype=torch.long, device=tree.tokens.device), slots=n,
                   tree_slots=n + tree.num_nodes, adapter_kv=kv, decoder=drafter.decoder)


def shared_layers(layers: Sequence[DecoderLayer], cache: KVCache, shared: int, x: Tensor, positions: Tensor,
                  mask: Tensor, model, rope: tuple[Tensor, Tensor] | None = None  # type: ignore[no-untyped-def]
                  ) -> tuple[Tensor, Tensor | None]:
    """B blocks x [B, Q, d] at positions [B, Q] through decoder layers whose keys are the first `shared`
    slots of a batch-1 cache (layer i = cache layer i, the same for every block) followed by each
    block's own K/V, under mask [B, Q, shared + Q], with the model's layer ops (fused on CUDA, as the
    target's own forward; rope: `model.rope(positions)` if the caller has it). Returns the last layer's
    residual stream (x, delta) [B, Q, d] (`DecoderLayer.step`: the output is their sum)."""
    b, q = x.shape[:2]
    cos, sin = rope if rope is not None else model.rope(positions)
    heads, dim = cache.k.shape[2], cache.k.shape[4]
    slots = torch.arange(q, device=x.device)[None].expand(b, q)
    meta = AttentionMeta(lengths=slots[:, 0], tree_mask=mask[:, :, shared:], kv_len=q)  # lengths 0 (a view of slots)
    attn_mask = mask[:, None]  # [B, 1, Q, shared + Q]
    x, delta = x.to(model.embed.weight.dtype), None
    for i, layer in enumerate(layers):
        k_new = torch.empty(b, heads, q, dim, dtype=cache.k.dtype, device=x.device)
        v_new = torch.empty_like(k_new)
        k_old, v_old = cache.k[i, :, :, :shared], cache.v[i, :, :, :shared]  # [1, Hkv, shared, D]

        def attend(qh: Tensor, k: Tensor, v: Tensor, _meta: AttentionMeta, scale: float,
                   k_old: Tensor = k_old, v_old: Tensor = v_old) -> Tensor:
            keys = torch.cat([k_old.expand(b, -1, -1, -1), k], dim=2)
            values = torch.cat([v_old.expand(b, -1, -1, -1), v], dim=2)
            return masked_sdpa(qh, keys, values, attn_mask, scale)

        x, delta = layer.step(x, delta, cos, sin, k_new, v_new, slots, meta, attend, model.ops)
    return x, delta


class OutcomeBatch:
    """The shared pieces of one round's foresight pass: outcomes (nodes [B], bonus [B]) of `tree`,
    whose nodes' predicted tapped states are `states` (tap -> [1, N, d])."""

    def __init__(self, drafter: "JetSpecPPDrafter", state: DraftState, tree: DraftTree, states: dict[int, Tensor],
                 nodes: Tensor, bonus: Tensor, context: Context | None = None) -> None:
        self.drafter, self.state, self.tree, self.states = drafter, state, tree, states
        self.nodes, self.bonus = nodes, bonus
        ctx = self.context = context if context is not None else host_context(drafter, state, tree)
        dev = nodes.device
        self.n, self.size = state.cache_len, tree.num_nodes
        b = drafter.block_size
        self.offsets = torch.arange(b, device=dev)
        self.positions = (ctx.length + tree.depth[nodes] + 1)[:, None] + self.offsets  # [B, b]
        self.ancestors = tree.ancestor_mask[nodes]  # [B, N]
        self.node_positions, self.node_rope = ctx.nodes if ctx.nodes is not None else \
            ((ctx.length + tree.depth)[None], None)  # [1, N]: the tree nodes' positions (and cos/sin)
        count = self.positions.shape[0]
        committed = slot_mask(ctx.slots, ctx.length).expand(count, -1)  # [B, S]
        placed = slot_mask(ctx.tree_slots, ctx.length, self.ancestors)  # [B, S']

        patterns: dict[str, Tensor] = {}  # within-block masks, built once per pattern

        def rows(context: Tensor, pattern: str) -> Tensor:  # [B, b, C + b]
            if pattern not in patterns:
                patterns[pattern] = block_pattern(b, pattern, dev)
            within = patterns[pattern]
            return torch.cat([context[:, None, :].expand(count, b, -1), within[None].expand(count, b, b)], dim=2)

        seen = torch.cat([committed, self.ancestors], dim=1)  # [B, S + N]
        self.head_mask = rows(seen, drafter.attention)  # keys: cache | tree | block
        self.adapter_mask = self.head_mask if drafter.attention == "block-causal" else rows(seen, "block-causal")
        self.causal_mask = rows(placed, "block-causal")  # keys: cache slots (tree nodes inside) | block
        model, head = drafter.target.model, drafter.head
        feats = torch.cat([states[t] for t in drafter.taps], dim=-1)  # [1, N, m*d]
        cache = drafter.cache
        assert cache is not None
        ext = head.context_kv(feats, self.node_positions, model, fused=True, rope=self._node_rope(head))
        self._ropes: dict[torch.dtype, tuple[Tensor, Tensor]] = {}  # every pass runs at `positions`
        s = ctx.slots
        self.head_kv = [(torch.cat([cache.k[i, :, :, :s], k], dim=2).expand(count, -1, -1, -1),
                         torch.cat([cache.v[i, :, :, :s], v], dim=2).expand(count, -1, -1, -1))
                        for i, (k, v) in enumerate(ext)]

    def _node_rope(self, net: DraftHead) -> tuple[Tensor, Tensor] | None:
        """The tree nodes' cos/sin for `net` when the context has them in its dtype (else None: computed)."""
        rope = self.node_rope
        return rope if rope is not None and rope[0].dtype == net.dtype else None

    def head_logp(self, tokens: Tensor, is_mask: Tensor | None) -> Tensor:
        """One batched head pass: tokens, is_mask [B, b] (None: no MASK row) -> log-probs [B, b, V] (fp32)."""
        d = self.drafter
        model = d.target.model
        x = d.head.embed_block(tokens, is_mask, model)
        hidden = d.head.forward_fused(x, self.positions, self.head_kv, self.head_mask, model, self.rope(d.head))
        return torch.log_softmax(d.head.logits(hidden, model.lm_head.weight).float(), dim=-1)

    def rope(self, net: DraftHead | None = None) -> tuple[Tensor, Tensor]:
        """cos, sin at `positions` in `net`'s dtype (None: the target's), once per dtype for every pass of
        the batch: `DraftHead.rope` is `Transformer.rope`'s formula in the head's dtype."""
        model = self.drafter.target.model
        dtype = net.dtype if net is not None else model.embed.weight.dtype
        if dtype not in self._ropes:
            self._ropes[dtype] = net.rope(self.positions, model) if net is not None else model.rope(self.positions)
        return self._ropes[dtype]

    def top_states(self, tokens: Tensor) -> Tensor:
        """The top tap's states [B, b, d] of each outcome's block `tokens` [B, b], from the drafter's
        state source, over that outcome's context."""
        d = self.drafter
        model, top = d.target.model, d.top
        count = tokens.shape[0]
        if d.states == "stale":
            assert d.last_verified is not None
            return d._tap_slice(d.last_verified, top).expand(count, tokens.shape[1], -1)
        if d.states == "true":
            assert d.oracle is not None
            x, delta = shared_layers(model.layers[: top + 1], d.oracle, self.context.tree_slots, model.embed(tokens),
                                     self.positions, self.causal_mask, model, self.rope())
            return x + delta if delta is not None else x
        tap = d.adapter.tap(top)  # type: ignore[union-attr]
        ext = tap.context_kv(self.states[top], self.node_positions, model, fused=True, rope=self._node_rope(tap.net))
        committed = self.context.adapter_kv
        assert committed is not None
        kv = [(torch.cat([ck, k], dim=2).expand(count, -1, -1, -1), torch.cat([cv, v], dim=2).expand(count, -1, -1, -1))
              for (ck, cv), (k, v) in zip(committed, ext)]
        return tap(tokens, self.positions, kv, self.adapter_mask, model, rope=self.rope(tap.net), fused=True)

    def decoder_logits(self, h_top: Tensor) -> Tensor:
        """p̂ logits [B, b, V] (fp32) of the blocks' top-tap states [B, b, d]: the decoder slice over
        the committed positions and each outcome's tree path (K/V left by the round's P̂ read)."""
        d = self.drafter
        dec, model = self.context.decoder, d.target.model
        assert dec is not None
        x, delta = shared_layers(dec.layers, dec.cache, self.context.tree_slots, h_top, self.positions,
                                 self.causal_mask, model, self.rope()) \
            if dec.layers else (h_top.to(model.embed.weight.dtype), None)
        return dec.head(x, delta).float()

    def refresh(self, drafts: Tensor) -> tuple[Tensor, Tensor]:
        """`JetSpecPPDrafter.refresh` for every outcome: drafts [B, D] -> (drafts with the decoder's
        token at depth k̂+1 when `replace`, k̂ [B])."""
        d = self.drafter
        tokens = torch.cat([self.bonus[:, None], drafts], dim=1)  # [B, b]
        top1 = self.decoder_logits(self.top_states(tokens)).max(dim=-1).indices[:, :-1]  # [B, D]
        k_hat = (top1 == drafts).long().cumprod(dim=1).sum(dim=1)  # [B]
        if d.replace:
            drafts = torch.where(self.offsets[None, :-1] == k_hat[:, None], top1, drafts)
        return drafts, k_hat

    def refined_logp(self) -> tuple[Tensor, list[Tensor]]:
        """J0, then for j = 1..J (refresh j <= R first) a Jacobi pass, as `JetSpecPPDrafter.refined_logp`
        does for one block: the last pass's per-depth log-probs [B, D, V] and k̂ [B] per refresh."""
        d = self.drafter
        count, b = self.bonus.shape[0], d.block_size
        tokens = self.bonus[:, None].expand(count, b)
        logp = self.head_logp(tokens, (self.offsets > 0)[None].expand(count, b))[:, 1:]  # J0
        drafts = logp.max(dim=-1).indices
        k_hats: list[Tensor] = []
        for j in range(1, d.J + 1):
            if j <= d.R:
                drafts, k_hat = self.refresh(drafts)
                k_hats.append(k_hat)
            logp = self.head_logp(torch.cat([self.bonus[:, None], drafts], dim=1), None)[:, 1:]
            drafts = logp.max(dim=-1).indices
        return logp, k_hats
