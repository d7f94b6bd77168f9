"""Foresight in jetspec++'s device round (methods.md §5.2 on the GPU round): the speculation cache as
static device buffers, filled by a capturable stage beside verification and looked up in the commit
stage, so the only host read per round is the engine's readout (which carries the hit flag).

    stage "foresight" (after drafting; on a second stream, beside the verify forward)
        states = the adapter's predicted states of this round's tree nodes (every kept tap)
        rows   = the decoder's p̂ of every node (per-depth calibrated), the rule's B outcomes
        blocks = the next block of each outcome, batched (`foresight.OutcomeBatch` over whole caches)
        cand   = the policy's tree of each block, in buffers [B, N]; keys [B]: (accepted count k,
                 accepted tokens d_1..d_k padded with -1, bonus a, valid)
    lookup (the drafter's `observe`, in the commit stage, after the main stream joined the stage)
        hit = some valid key equals the Acceptance's (count - 1, accepted tokens, bonus); index =
        the first such key (the host cache keeps the first of equal outcomes too)
    serve (the next round's only drafting stage when the read flag says hit)
        the cached tree at index -> the served tree buffers (device copies)

A key is spelled in tokens, as the host cache's (`cache.Outcome`): what the next block conditions
on is the committed token sequence. The cache holds this block's candidates only (each stage
overwrites them), so a block drafted for another outcome or an earlier block is never served.
Non-anticipation (§1.5): the stage reads the committed context and the tree's tokens, never the
verify forward's output; the next round depends on the outcome only through the lookup.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specbench.drafters.base import DraftState
from specbench.drafters.jetspecpp.foresight import Context, OutcomeBatch
from specbench.drafters.jetspecpp.calibration import RowTemperature
from specbench.drafters.jetspecpp.ngram import boost, match_levels
from specbench.drafters.jetspecpp.selection import RowLaw, select
from specbench.trees.base import DraftTree, TreeBatch, TreePolicy

if TYPE_CHECKING:
    from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
    from specbench.drafters.jetspecpp.speculation import Foresight


def outcome_keys(tree: DraftTree, nodes: Tensor) -> tuple[Tensor, Tensor]:
    """(accepted count k [B], accepted tokens [B, N-1] padded with -1) of the outcomes that stop at
    `nodes` [B] of `tree`: the tokens of the node's ancestors at depths 1..k, in depth order."""
    n = tree.num_nodes
    anc = tree.ancestor_mask[nodes] & (tree.depth >= 1)[None]  # [B, N]
    col = torch.where(anc, tree.depth[None] - 1, n - 1)  # column n - 1: a dump, cut off below
    keys = tree.tokens.new_full((nodes.shape[0], n), -1)
    keys.scatter_(1, col, tree.tokens[None].expand(nodes.shape[0], n))
    return tree.depth[nodes], keys[:, : n - 1]


def verified_key(tree: DraftTree, path: Tensor, count: Tensor) -> Tensor:
    """The accepted tokens [N-1] (padded with -1) of a verify result: path [N] node ids (root first,
    -1 padded), count [1] accepted nodes."""
    n = tree.num_nodes
    j = torch.arange(1, n, device=path.device)
    return torch.where(j < count, tree.tokens[path[1:].clamp(min=0)], -1)


def match(key_len: Tensor, key_tokens: Tensor, key_bonus: Tensor, valid: Tensor, count: Tensor, accepted: Tensor,
          bonus: Tensor) -> tuple[Tensor, Tensor]:
    """(hit [1] int64, index [1] int64: the first valid key equal to the verified outcome, 0 on a miss)."""
    eq = valid & (key_len == count - 1) & (key_tokens == accepted[None]).all(dim=1) & (key_bonus == bonus)  # [B]
    return eq.any().long().view(1), eq.long().argmax().view(1)


class DeviceForesight:
    """The device round's speculation cache for one `JetSpecPPDrafter` (module docstring); buffers are
    allocated at the first stage run (eager), so captured replays write the same tensors."""

    def __init__(self, drafter: "JetSpecPPDrafter", foresight: "Foresight") -> None:
        self.drafter, self.foresight = drafter, foresight
        dev = drafter.target.device
        self.hit = torch.zeros(1, dtype=torch.long, device=dev)
        self.index = torch.zeros(1, dtype=torch.long, device=dev)
        self.cand: dict[str, Tensor] = {}  # the B candidate trees: tokens, parents, depth (scores) [B, N], ancestor_mask [B, N, N]
        self.keys: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # len [B], tokens [B, N-1], bonus [B], valid [B]
        self.served: DraftTree | None = None  # [N]: the next round's tree on a hit
        cal = foresight.calibration or RowTemperature.identity()
        self.betas = torch.tensor(cal.betas, dtype=torch.float64, device=dev)  # per-depth inverse temperatures
        # the context n-gram expert (`ngram.py`): per-order boosts, and the committed tokens on the device
        self.etas = torch.tensor(cal.etas, dtype=torch.float64, device=dev) if cal.etas else None
        self.context: Tensor | None = None  # [S] committed tokens (the anchor at `length`)
        self.length = torch.zeros(1, dtype=torch.long, device=dev)

    def reset(self, tokens: list[int] | None = None, max_seq_len: int = 0) -> None:
        """A new request: nothing is cached (the first round drafts on the critical path); with the
        n-gram expert its committed `tokens` (prompt and anchor) enter the context buffer."""
        self.hit.zero_()
        if self.keys is not None:
            self.keys[3].zero_()
        if self.etas is None or tokens is None:
            return
        slots = max(max_seq_len, len(tokens)) + self.drafter.max_path + 2  # a round appends <= max_path + 1; one dump slot
        if self.context is None or self.context.shape[0] < slots:
            self.context = torch.full((slots,), -1, dtype=torch.long, device=self.length.device)
        self.context.fill_(-1)
        self.context[: len(tokens)].copy_(torch.tensor(tokens, dtype=torch.long))
        self.length.fill_(len(tokens) - 1)

    @torch.no_grad()
    def run(self, state: DraftState, tree: DraftTree, policy: TreePolicy, budget: int) -> None:
        """The foresight stage for `tree` (this round's, not yet verified)."""
        d, f = self.drafter, self.foresight
        ds = d._device_states()
        n = tree.num_nodes
        slots = d._kv_len(state, n)
        plan = ds.plan(tree.depth, tree.ancestor_mask, slots)  # one mask and RoPE for every tap's adapter and the decoder
        states = ds.block(tree.tokens, tree.depth, tree.ancestor_mask, d.taps, slots, plan)  # tap -> [1, N, d]
        logits = ds.decoder.read(states[d.top], tree.depth, tree.ancestor_mask, slots, plan.meta.rows(1), plan.rope,
                                 plan.slots)  # [N, V]
        law = self.decoder_law(logits, tree, min(logits.shape[-1], f.B + n))
        sel = select(f.rule, law, tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, f.B, lam=f.lam,
                     ratio=f.ratio)
        ctx = Context(length=ds.decoder.cache.lengths, kv_len=d._kv_len(state, n + f.B * d.block_size),
                      adapter=ds.tap_cache(d.top), decoder=ds.decoder, nodes=plan)
        blocks, _ = OutcomeBatch(d, state, tree, states, sel.nodes, sel.tokens, ctx).refined_logp()  # [B, D, V]
        trees = policy.build_batch(sel.tokens, blocks, budget)  # [B, N']: one batched build, not B
        key_len, key_tokens = outcome_keys(tree, sel.nodes)
        if self.served is None:
            self._allocate(trees, key_tokens.shape[1])
        assert self.keys is not None
        for name, buf in self.cand.items():
            if name != "ancestor_mask":
                buf.copy_(getattr(trees, name))
        self.cand["ancestor_mask"].copy_(trees.masks())  # one batched pass (or the builder's), not B
        for buf, value in zip(self.keys, (key_len, key_tokens, sel.tokens, sel.valid)):
            buf.copy_(value)

    def decoder_law(self, logits: Tensor, tree: DraftTree, k: int) -> RowLaw:
        """The decoder's rows [N, V] at the calibrated per-depth inverse temperatures (T = 0), as the host
        round's `Foresight.decoder_law` (equal up to float64 rounding), from a table on the device.

        Without materialising the float64 rows: row u is z_u = beta_u l_u + boost(level(u, .)) with
        beta_u > 0 and boosts >= 0 that are 0 for tokens absent from the context, so its top-k lies among
        the top-k of the raw row l_u and the context's tokens (a token outside both is outranked by, or
        tied with, each of the raw top-k). The selection runs over those k + S candidates; the full
        vocabulary is read by one top-k of the raw row and one log-partition. On the H200 the float64
        log-softmax, the [N, V] boost table and the float64 top-k over the vocabulary (a radix select:
        eight passes of ~4 launches for 64-bit values) were ~0.25 ms of the foresight stage."""
        beta = self.betas[tree.depth.clamp(max=self.betas.shape[0] - 1)]  # [N]
        top, raw_ids = logits.topk(k, dim=-1)  # [N, K]: raw order = order of beta * l
        scaled = logits.to(torch.float64) * beta[:, None]  # [N, V]
        lse = torch.logsumexp(scaled, dim=-1)  # [N]: log-partition of the unboosted rows
        parent = tree.parents.clamp(min=0)
        child_scaled = scaled[parent, tree.tokens]  # [N]: node v's token in its parent's row
        if self.etas is None:
            logp = beta[:, None] * top.to(torch.float64) - lse[:, None]
            child = child_scaled - lse[parent]
            return RowLaw(ids=raw_ids, logp=logp, child_logp=torch.where(tree.parents >= 0, child, 0.0))
        assert self.context is not None, "reset(tokens) before the first stage"
        ctx, n, v = self.context, tree.num_nodes, logits.shape[-1]
        s = ctx.shape[0]
        j = torch.arange(s, device=ctx.device)
        committed = j <= self.length  # [S]: the committed tokens, the anchor at `length`
        tok = ctx.clamp(min=0)
        first = torch.full((v + 1,), s, dtype=torch.long, device=ctx.device).scatter_reduce_(
            0, torch.where(committed, tok, v), j, reduce="amin")  # [V + 1]: a token's first position (S: absent)
        fpos = first[tok]  # [S]
        lead = committed & (fpos == j)  # [S]: one position per distinct context token
        match = match_levels(ctx, self.length, tree.tokens, tree.depth, tree.ancestor_mask, self.etas.shape[0] - 1)
        level = torch.zeros(n, s + 1, dtype=torch.long, device=ctx.device).scatter_reduce_(
            1, torch.where(committed, fpos, s)[None].expand(n, s), match, reduce="amax")  # [N, S + 1]: per token, at its lead
        # column S (absent tokens) stays 0: only positions past `length` land there, and their match is 0
        raw_level = level.gather(1, first[raw_ids])  # [N, K]
        in_raw = (tok[None, :, None] == raw_ids[:, None, :]).any(dim=-1)  # [N, S]
        ctx_scaled = scaled[:, tok]  # [N, S]
        boosts = boost(level[:, :s], self.etas)  # [N, S]
        extra = torch.where(lead[None], torch.exp(ctx_scaled - lse[:, None]) * torch.expm1(boosts), 0.0).sum(dim=1)
        log_z = lse + torch.log1p(extra)  # [N]: log-partition of the boosted rows
        cand = torch.cat([beta[:, None] * top.to(torch.float64) + boost(raw_level, self.etas),
                          torch.where((lead[None] & ~in_raw), ctx_scaled + boosts, -math.inf)], dim=1)  # [N, K + S]
        logp, order = (cand - log_z[:, None]).topk(k, dim=-1)
        ids = torch.cat([raw_ids, tok[None].expand(n, s)], dim=1).gather(1, order)
        child = child_scaled + boost(level[parent, first[tree.tokens]], self.etas) - log_z[parent]
        return RowLaw(ids=ids, logp=logp, child_logp=torch.where(tree.parents >= 0, child, 0.0))

    def append(self, tree: DraftTree, path: Tensor, count: Tensor, bonus: Tensor) -> None:
        """The verified outcome's accepted tokens and bonus enter the n-gram context (device ops of
        static shape: entries past count go to the dump slot)."""
        assert self.context is not None
        n, dump = tree.num_nodes, self.context.shape[0] - 1
        j = torch.arange(1, n, device=path.device)
        pos = torch.where(j < count, self.length + j, dump)  # [N-1]
        self.context.scatter_(0, pos, tree.tokens[path[1:].clamp(min=0)])
        self.context.scatter_(0, self.length + count, bonus)
        self.length.add_(count)

    def _allocate(self, trees: TreeBatch, width: int) -> None:
        (b, n), dev = trees.tokens.shape, trees.tokens.device
        fields = ("tokens", "parents", "depth") + (("scores",) if trees.scores is not None else ())
        self.cand = {name: getattr(trees, name).new_zeros(b, n) for name in fields}
        self.cand["ancestor_mask"] = torch.zeros(b, n, n, dtype=torch.bool, device=dev)
        self.keys = (torch.zeros(b, dtype=torch.long, device=dev), torch.full((b, width), -1, dtype=torch.long, device=dev),
                     torch.zeros(b, dtype=torch.long, device=dev), torch.zeros(b, dtype=torch.bool, device=dev))
        self.served = DraftTree(**{name: buf[0].clone() for name, buf in self.cand.items() if name != "ancestor_mask"},
                                depth_bound=trees.depth_bound)
        self.served.__dict__["ancestor_mask"] = self.cand["ancestor_mask"][0].clone()  # a static buffer, not derived

    def lookup(self, tree: DraftTree, path: Tensor, count: Tensor, bonus: Tensor) -> None:
        """The verified outcome (path [N], count [1], bonus [1] of `tree`) against the keys."""
        if self.etas is not None:
            self.append(tree, path, count, bonus)
        if self.keys is None:  # no stage ran yet (the eager first round): nothing cached
            self.hit.zero_()
            return
        key_len, key_tokens, key_bonus, valid = self.keys
        hit, index = match(key_len, key_tokens, key_bonus, valid, count, verified_key(tree, path, count), bonus)
        self.hit.copy_(hit)
        self.index.copy_(index)

    def serve(self) -> DraftTree:
        """The cached tree of the verified outcome, copied into the served buffers."""
        served = self.served
        assert served is not None, "serve() before any foresight stage ran"
        for name, buf in self.cand.items():
            getattr(served, name).copy_(buf.index_select(0, self.index)[0])
        return served
