"""Foresight drafting (methods.md §5.2): the next block for each of B selected verification outcomes of
the block under verification, in one batched pass of the draft model per step (J0, each refresh, each
Jacobi pass).

Outcome o = (node u_o, bonus a_o) commits the tree's root and the path to u_o, so its next block
reads the verified context (positions < n) followed by those nodes' *predicted* tapped states (the
adapter's, or the stale / true ablations) at positions n + depth, and starts with anchor a_o at
position n + depth(u_o) + 1. The predicted states of every tree node are computed once per round
(they depend only on the block's tokens), so the B outcomes share one key/value set
[committed n ; tree nodes N] and differ only in which tree nodes they may see (u_o's ancestors,
a row of the tree's ancestor mask) and in their own block.

The B blocks run as one flat row set of Q = B x b rows (row r: outcome r // b, offset r % b) in every
cache it reads, batch 1, as a tree is verified: each cache holds [committed n | the tree nodes' K/V
at n + node | the blocks' K/V at n + N + r] (scratch past the committed slots), and one mask over its
slots serves every pass and layer:

    mask[r] = [ ones(n) | ancestors(u_o) | block pattern of row r within block o ]   # [Q, n + N + Q]

(over whole caches of static size in the device round, the committed part and the scratch placed from
the committed length on the device, so the foresight stage is capturable; `flat_mask`). No cache is
copied per outcome and nothing is concatenated per layer.

The draft head and the refresh's adapter get the tree nodes' context K/V from their predicted states
(written into the scratch); the decoder (and the `true` oracle) find them where the round's P̂ read
(or oracle pass) just left them (`SliceDecoder.read` leaves the block's K/V in the slots after the
committed ones). On true states this is exactly the critical-path draft after that outcome (tested),
and on predicted states it is the critical-path draft with the predicted states in place of the true
ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specbench.drafters.base import DraftState
from specbench.drafters.heads.backbone import DraftHead
from specbench.drafters.heads.masks import block_pattern
from specbench.drafters.heads.drafter import BlockPlan
from specbench.drafters.jetspecpp.decoder import SliceDecoder, cached_layers
from specbench.models.decoder import AttentionFn, AttentionMeta, KVCache, is_triton_backend, residual_sum, sdpa_attention
from specbench.trees.base import DraftTree

if TYPE_CHECKING:
    from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter


def flat_pattern(count: int, b: int, pattern: str, device: torch.device | str) -> Tensor:
    """The within-block mask of `count` blocks of b rows as one flat row set, padded: [Q, 1 + Q + 1]
    (Q = count x b) = [ones | block-diagonal: row r sees row r' iff both are rows of one block and its
    `pattern` lets it | zeros] (`flat_mask`'s committed and free columns around the flat rows')."""
    within = block_pattern(b, pattern, device)
    same = torch.eye(count, dtype=torch.bool, device=device)
    flat = (same[:, None, :, None] & within[None, :, None, :]).reshape(count * b, count * b)
    ones = torch.ones(count * b, 1, dtype=torch.bool, device=device)
    return torch.cat([ones, flat, ~ones], dim=1)


def flat_mask(length: Tensor, after: Tensor, ancestors: Tensor, padded: Tensor) -> Tensor:
    """[1, 1, Q, S] the flat rows' mask over a cache's slots (module docstring): the committed slots
    (< length [1]), tree node j at length + j where it is an ancestor of the row's outcome node
    (ancestors [Q, N]: the row's outcome's row of the ancestor mask), flat row r' at length + N + r'
    where the block pattern lets it (padded: `flat_pattern`). after [S]: 1 .. S (slot + 1). One gather
    from the rows' keys [committed | tree nodes | flat rows | free]."""
    q, n = ancestors.shape
    keys = torch.cat([padded[:, :1], ancestors, padded[:, 1:]], dim=1)  # [Q, 1 + N + Q + 1]
    return keys[:, (after - length).clamp(0, n + q + 1)][None, None]


def flat_attention(keys: Tensor, kv_len: int) -> AttentionFn:
    """The flat rows' attention on the tree-attention kernel (CUDA, the target's `triton` backend): keys
    [Q, N + Q] = which new entries row r sees (the tree nodes at length + j, j < N, then the flat rows),
    packed once; the committed slots (< meta.lengths) are all seen. What `flat_mask` spells over the
    whole cache for SDPA, read without the slots past the rows: SDPA with that dense mask reads every
    one of the kv_len slots (~43 us a layer over a 2,048-slot cache on the H200, profiled; the kernel
    reads the committed length only)."""
    from specbench.kernels.pack_bits import pack_bits  # imports Triton: CUDA only
    from specbench.kernels.tree_attention import context_attention

    bits = pack_bits(keys)[None]  # [1, Q, W]
    new = keys.shape[1]

    def attend(q: Tensor, k: Tensor, v: Tensor, meta: AttentionMeta, scale: float) -> Tensor:
        return context_attention(q, k, v, meta.lengths, k, v, bits, scale, new_after_context=True, num_new=new,
                                 context_hint=max(kv_len - new, 0))

    return attend


def top1(scores: Tensor) -> Tensor:
    """[..., V] -> [...]: each row's first maximal index. Intermediate passes read their raw logits: the
    log-softmax shifts a row by a constant, so only a rounding tie could change the pick, and the
    critical path (`JetSpecPPDrafter.refined_logp`) reads its passes the same way, so a block drafted
    ahead is the one drafted on the critical path."""
    return scores.max(dim=-1).indices


@dataclass
class Context:
    """Where an outcome batch reads: `length` [1] committed positions (a device tensor), `kv_len` the
    leading slots every pass reads of every cache (>= length + N + Q; those past the flat rows' are
    masked out), the top tap adapter module's context cache (states=predicted) and the decoder. The
    host round reads exactly the filled slots (`host_context`); the device round whole caches. nodes:
    the P̂ read's plan (the tree nodes' positions, cos/sin and slots), if the caller has it."""

    length: Tensor
    kv_len: int
    adapter: KVCache | None
    decoder: SliceDecoder | None
    nodes: BlockPlan | None = None


def host_context(drafter: "JetSpecPPDrafter", state: DraftState, tree: DraftTree, count: int) -> Context:
    """The host round's context for `count` outcomes: the committed positions of `state`, the drafter's
    host-side caches."""
    n = state.cache_len
    cache = drafter.adapter_caches[drafter.top].cache if drafter.adapter_caches else None
    return Context(length=torch.full((1,), n, dtype=torch.long, device=tree.tokens.device),
                   kv_len=n + tree.num_nodes + count * drafter.block_size, adapter=cache, decoder=drafter.decoder)


class OutcomeBatch:
    """The shared pieces of one round's foresight pass: outcomes (nodes [B], bonus [B]) of `tree`,
    whose nodes' predicted tapped states are `states` (tap -> [1, N, d]), as Q = B x b flat rows."""

    def __init__(self, drafter: "JetSpecPPDrafter", state: DraftState, tree: DraftTree, states: dict[int, Tensor],
                 nodes: Tensor, bonus: Tensor, context: Context | None = None) -> None:
        self.drafter, self.state, self.tree, self.states = drafter, state, tree, states
        self.nodes, self.bonus = nodes, bonus
        count, b, n = nodes.shape[0], drafter.block_size, tree.num_nodes
        ctx = self.context = context if context is not None else host_context(drafter, state, tree, count)
        dev, model = nodes.device, drafter.target.model
        caches = [drafter.cache, ctx.adapter, ctx.decoder.cache if ctx.decoder is not None else None, drafter.oracle]
        short = [c.max_seq_len for c in caches if c is not None and c.max_seq_len < ctx.kv_len]
        if short:
            raise RuntimeError(f"foresight reads {ctx.kv_len} cache slots, a cache holds {short[0]}: begin() sizes the "
                               f"caches for B = {count} blocks")
        q = count * b
        table = drafter.table
        self.offsets = table(("arange", b), lambda: torch.arange(b, device=dev))
        if ctx.nodes is not None:
            self.node_positions, node_rope, self.node_slots = ctx.nodes.positions, ctx.nodes.rope, ctx.nodes.slots
        else:
            self.node_positions, node_rope = (ctx.length + tree.depth)[None], None  # [1, N]
            self.node_slots = ctx.length[:, None] + torch.arange(n, device=dev)  # [1, N]
        self.node_rope = node_rope if node_rope is None or node_rope[0].dtype == drafter.head.dtype else None
        after = table(("arange", 1, b + 1), lambda: torch.arange(1, b + 1, device=dev))
        self.positions = (self.node_positions[0, nodes][:, None] + after).view(1, q)  # [1, Q]: depth(u) + 1 + offset
        self.slots = ctx.length + table(("arange", n, n + q), lambda: torch.arange(n, n + q, device=dev)[None])  # [1, Q]
        self.is_mask = table(("flat mask rows", count, b), lambda: (torch.arange(q, device=dev) % b > 0)[None])  # J0's
        self.shape = (count, b)
        self._ropes: dict[torch.dtype, tuple[Tensor, Tensor]] = {}  # every pass runs at `positions`
        rows = tree.ancestor_mask[nodes.repeat_interleave(b)]  # [Q, N]: each flat row's outcome's ancestors
        s = drafter.cache.max_seq_len  # type: ignore[union-attr]
        slot_after = table(("arange", 1, s + 1), lambda: torch.arange(1, s + 1, device=dev))[: ctx.kv_len]
        self._metas: dict[str, tuple[AttentionMeta, AttentionFn]] = {}
        triton = is_triton_backend(model.attention)

        def meta(pattern: str) -> tuple[AttentionMeta, AttentionFn]:  # one per block pattern, every pass and layer
            if pattern not in self._metas:
                padded = table(("flat pattern", count, b, pattern), lambda: flat_pattern(count, b, pattern, dev))
                within = padded[None, :, 1: q + 1]  # [1, Q, Q]
                if triton:  # the tree-attention kernel: committed slots + the masked tree nodes and flat rows
                    self._metas[pattern] = (AttentionMeta(lengths=ctx.length, tree_mask=within, kv_len=ctx.kv_len),
                                            flat_attention(torch.cat([rows, padded[:, 1: q + 1]], dim=1), ctx.kv_len))
                else:
                    self._metas[pattern] = (AttentionMeta(lengths=ctx.length, tree_mask=within, kv_len=ctx.kv_len,
                                                          dense_mask=flat_mask(ctx.length, slot_after, rows, padded)),
                                            sdpa_attention)
            return self._metas[pattern]

        (self.head_meta, self.head_attend), (self.causal_meta, self.causal_attend) = \
            meta(drafter.attention), meta("block-causal")
        feats = torch.cat([states[t] for t in drafter.taps], dim=-1)  # [1, N, m*d]
        assert drafter.cache is not None
        drafter.head.write_context(feats, self.node_positions, drafter.cache, model, slots=self.node_slots,
                                   rope=self.node_rope, fused=True)  # the tree nodes' head K/V, into the scratch

    def rope(self, net: DraftHead | None = None) -> tuple[Tensor, Tensor]:
        """cos, sin at `positions` in `net`'s dtype (None: the target's), once per dtype for every pass of
        the batch: `DraftHead.rope` is `Transformer.rope`'s formula in the head's dtype."""
        model = self.drafter.target.model
        dtype = net.dtype if net is not None else model.embed.weight.dtype
        if dtype not in self._ropes:
            self._ropes[dtype] = net.rope(self.positions, model) if net is not None else model.rope(self.positions)
        return self._ropes[dtype]

    def head_logp(self, tokens: Tensor, is_mask: Tensor | None, log_probs: bool = True) -> Tensor:
        """One batched head pass: tokens, is_mask [B, b] (None: no MASK row) -> log-probs [B, b, V] (fp32);
        log_probs False: the raw logits [B, b, V] in the head's dtype, for a pass read only by its argmax
        (`top1`: the fp32 cast and log-softmax over B x b vocabulary rows cost ~60 us on the H200)."""
        d = self.drafter
        model = d.target.model
        q = tokens.numel()
        x = d.head.embed_block(tokens.reshape(1, q), None if is_mask is None else is_mask.reshape(1, q), model)
        hidden = d.head.forward_cached(x, self.positions, d.cache, self.head_meta, model, self.rope(d.head),  # type: ignore[arg-type]
                                       self.slots, self.head_attend)
        logits = d.head.logits(hidden, model.lm_head.weight)
        if not log_probs:
            return logits.view(*self.shape, -1)
        return torch.log_softmax(logits, dim=-1, dtype=torch.float32).view(*self.shape, -1)  # no separate fp32 cast

    def top_states(self, tokens: Tensor) -> Tensor:
        """The top tap's states [1, Q, d] of the outcomes' block `tokens` [B, b] (flat), from the drafter's
        state source, over each outcome's context."""
        d = self.drafter
        model, top, meta = d.target.model, d.top, self.causal_meta
        q = tokens.numel()
        if d.states == "stale":  # the ablations run in the host round
            assert d.last_verified is not None
            return d._tap_slice(d.last_verified, top).expand(1, q, -1)
        if d.states == "true":
            assert d.oracle is not None
            x, delta = cached_layers(model.layers[: top + 1], d.oracle, model.embed(tokens.reshape(1, q)), self.rope(),
                                     self.slots, meta, model, self.causal_attend)
            return residual_sum(x, delta)
        tap = d.adapter.tap(top)  # type: ignore[union-attr]
        cache = self.context.adapter
        assert cache is not None
        tap.net.write_context(self.states[top], self.node_positions, cache, model, slots=self.node_slots,
                              rope=self.node_rope, fused=True)  # the tree nodes' adapter K/V, into the scratch
        return tap.forward_cached(tokens.reshape(1, q), self.positions, cache, meta, model, self.rope(tap.net),
                                  self.slots, self.causal_attend)

    def decoder_logits(self, h_top: Tensor) -> Tensor:
        """p̂ logits [B, b, V] (the target's dtype: read by their argmax only, which an fp32 cast would
        not change) of the blocks' top-tap states [1, Q, d]: the decoder slice over the committed
        positions and each outcome's tree path (K/V left by the round's P̂ read)."""
        d = self.drafter
        dec, model = self.context.decoder, d.target.model
        assert dec is not None
        x, delta = cached_layers(dec.layers, dec.cache, h_top, self.rope(), self.slots, self.causal_meta, model,
                                 self.causal_attend)
        return dec.head(x, delta).view(*self.shape, -1)

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
        count, b = self.shape
        tokens = self.bonus[:, None].expand(count, b)
        logp = self.head_logp(tokens, self.is_mask, log_probs=d.J == 0)[:, 1:]  # J0
        drafts = top1(logp)
        k_hats: list[Tensor] = []
        for j in range(1, d.J + 1):
            if j <= d.R:
                drafts, k_hat = self.refresh(drafts)
                k_hats.append(k_hat)
            logp = self.head_logp(torch.cat([self.bonus[:, None], drafts], dim=1), None, log_probs=j == d.J)[:, 1:]
            if j < d.J:  # the last pass's tokens are the tree's business
                drafts = top1(logp)
        return logp, k_hats
