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

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specbench.drafters.base import DraftState
from specbench.drafters.jetspecpp.foresight import Context, OutcomeBatch
from specbench.drafters.jetspecpp.calibration import RowTemperature
from specbench.drafters.jetspecpp.ngram import boost, tree_levels
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
        round's `Foresight.decoder_law` (equal up to float64 rounding), from a table on the device."""
        beta = self.betas[tree.depth.clamp(max=self.betas.shape[0] - 1)]  # [N]
        z = logits.to(torch.float64) * beta[:, None]  # [N, V]
        if self.etas is not None:
            assert self.context is not None, "reset(tokens) before the first stage"
            z = z + boost(tree_levels(self.context, self.length, tree.tokens, tree.depth, tree.ancestor_mask,
                                      self.etas.shape[0] - 1, z.shape[-1]), self.etas)
        return RowLaw.from_logp(z.log_softmax(dim=-1), tree.tokens, tree.parents, k)

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
