"""The context refresh's state source in jetspec++'s device round (`JetSpecPPDrafter.capturable`):
committed positions enter preallocated caches in `commit`, straight from the verify pass's accepted
rows (the `Acceptance`'s device tensors, padded to a fixed row count), with every cache's length on
the device; block states are read in tensor ops of static shape. Nothing is read back, so the GPU
round captures both (CUDA graphs).

What each `states` setting keeps, besides the decoder's upper-layer K/V (`SliceDecoder.write`):
  predicted  per kept tap, the adapter module's context K/V, written as the draft head's own cache
             is (`write_committed`); block states by `TapAdapter.forward_cached`; the taps of one
             layer count as one batched pass (`tap_stack.TapStack`, one cache of batch T)
  stale      per kept tap, the newest committed position's state (a buffer, gathered at count - 1)
  true       a target KV cache of the committed tokens (the oracle; layers up to the top tap run)

The host round (host=true, foresight, another draft device) keeps its own queue-and-sync caches
(`adapter.ContextCache`, `SliceDecoder.extend`) in the drafter; this file is the device twin.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.drafters.heads.drafter import BlockPlan
from specbench.drafters.jetspecpp.adapter import StateAdapter
from specbench.drafters.jetspecpp.decoder import SliceDecoder
from specbench.drafters.jetspecpp.tap_stack import TapStack
from specbench.models.decoder import AttentionMeta, KVCache
from specbench.models.target import TargetModel


class DeviceStates:
    """Block states of the kept `taps` (and the decoder over the top one) from device-written caches of
    `slots` positions (committed ones + scratch for a block and a padded commit)."""

    def __init__(self, target: TargetModel, adapter: StateAdapter | None, states: str, taps: tuple[int, ...],
                 top: int, slots: int) -> None:
        cfg, dev = target.config, target.device
        self.model, self.adapter, self.states, self.taps, self.top = target.model, adapter, states, taps, top
        self.decoder = SliceDecoder(target, top, slots)
        self.stacks: list[TapStack] = []  # largest first (the plan's meta is its batch)
        if states == "predicted":
            assert adapter is not None, "states=predicted needs the adapter"
            groups: dict[int, list[int]] = {}
            for t in taps:
                groups.setdefault(adapter.tap(t).net.config.num_layers, []).append(t)
            self.stacks = sorted((TapStack(g, adapter, target, slots) for g in groups.values()),
                                 key=lambda st: -st.size)
        self.last = {t: torch.zeros(1, 1, cfg.hidden_size, dtype=target.dtype, device=dev) for t in taps} \
            if states == "stale" else {}
        self.oracle = target.new_cache(slots) if states == "true" else None

    @property
    def max_seq_len(self) -> int:
        return self.decoder.cache.max_seq_len

    def reset(self) -> None:
        self.decoder.reset()
        for stack in self.stacks:
            stack.reset()
        if self.oracle is not None:
            self.oracle.reset()

    def commit(self, hidden: dict[int, Tensor], tokens: Tensor, count: Tensor, kv_len: int, slots: Tensor | None = None,
               rope: tuple[Tensor, Tensor] | None = None) -> None:
        """The next committed positions: per kept tap their true states [1, P, d] (root first), their
        tokens [P], of which the first count [1] are real (the rest land past the new lengths, free);
        kv_len: the slots an attention over them reads (>= committed + P). slots [1, P] (= positions,
        from the committed length) and their RoPE `model.rope(slots)`, if the caller has them."""
        p = tokens.shape[0]
        if slots is None:
            slots = self.decoder.cache.lengths[:, None] + torch.arange(p, device=tokens.device)  # [1, P]: = positions
        rope = rope if rope is not None else self.model.rope(slots)
        for stack in self.stacks:
            feats = torch.cat([hidden[t] for t in stack.taps]) if stack.size > 1 else hidden[stack.taps[0]]  # [T, P, d]
            stack.write(feats, count, rope, slots, self.model)
        self.decoder.write(hidden[self.top], count, kv_len, rope, slots)
        for t, buf in self.last.items():
            buf.copy_(hidden[t].index_select(1, count - 1))  # [1, 1, d]: the newest committed position
        if self.oracle is not None:
            positions = self.oracle.lengths[:, None] + torch.arange(p, device=tokens.device)
            self.model(tokens[None], positions, self.oracle, None, (), logits_rows=self._no_logits(tokens),
                       num_layers=self.top + 1, kv_len=kv_len)
            self.oracle.advance_device(count)

    def plan(self, depth: Tensor, within: Tensor, kv_len: int, batch: int | None = None) -> BlockPlan:
        """What every tap's adapter and the decoder (and the draft head: its cache moves with these) share
        in a read of block rows at depth [Q] (within-block mask [Q, Q], `kv_len` slots): `commit` and
        `reset` move every cache together, so one committed length serves all, one attention mask and one
        RoPE table (`Transformer.rope`, the formula of `DraftHead.rope`). The meta reads `batch` rows
        (None: the largest tap stack's; `meta.rows(n)` for fewer)."""
        lengths = self.decoder.cache.lengths
        positions = (lengths + depth)[None]
        q = depth.shape[0]
        slots = lengths[:, None] + torch.arange(q, device=depth.device)
        rows = self.stacks[0].cache.lengths if self.stacks else lengths  # equal committed lengths, one per row
        rows = rows[:batch] if batch is not None else rows
        meta = AttentionMeta(lengths=rows, tree_mask=within[None].expand(rows.shape[0], q, q), kv_len=kv_len)
        return BlockPlan(meta, positions, self.model.rope(positions), slots)

    def tap_cache(self, tap: int) -> KVCache:
        """The adapter module's context cache of `tap` (states=predicted): its row of its stack's cache."""
        stack = next(st for st in self.stacks if tap in st.taps)
        j = stack.taps.index(tap)
        return stack.cache.rows(slice(j, j + 1))

    def block(self, tokens: Tensor, depth: Tensor, within: Tensor, taps: tuple[int, ...], kv_len: int,
              plan: BlockPlan | None = None) -> dict[int, Tensor]:
        """States [1, Q, d] per tap of block/tree rows `tokens` [Q] at positions committed + depth [Q],
        within-block mask [Q, Q], reading `kv_len` slots (>= committed + Q); `plan`: the read's `plan`."""
        q = tokens.shape[0]
        if self.states != "true" and not set(taps) <= set(self.taps):
            raise ValueError(f"the device round keeps the states of taps {list(self.taps)} only, asked for {list(taps)}: "
                             f"pass drafter_args host=true for every tap's")
        if self.states == "stale":
            return {t: self.last[t].expand(1, q, -1) for t in taps}
        if self.states == "true":
            assert self.oracle is not None
            out = self.model(tokens[None], (self.oracle.lengths + depth)[None], self.oracle, within[None], taps,
                             logits_rows=self._no_logits(tokens), num_layers=self.top + 1, kv_len=kv_len)
            return {t: out.hidden[t] for t in taps}
        plan = plan if plan is not None else self.plan(depth, within, kv_len)
        out = {}
        for stack in self.stacks:  # the largest first: its batch's mask is built once, sliced for the rest
            wanted = [j for j, t in enumerate(stack.taps) if t in taps]
            if not wanted:
                continue
            rows = slice(wanted[0], wanted[0] + 1) if len(wanted) == 1 else slice(None)  # one tap: its row only
            states = stack.block(tokens, plan.rope, plan.slots, plan.meta.rows(len(range(stack.size)[rows])),
                                 self.model, rows)  # [T', Q, d]
            out.update({t: states[j - (rows.start or 0)][None] for j, t in enumerate(stack.taps) if t in taps})
        return out

    def decoder_logits(self, tokens: Tensor, depth: Tensor, within: Tensor, kv_len: int,
                       plan: BlockPlan | None = None) -> Tensor:
        """[Q, V] fp32 logits of p̂(.|row) from the top tap's block states (row j: the token after row j);
        plan: this read's `plan` (batch 1 serves: only the top tap is read)."""
        plan = plan if plan is not None else self.plan(depth, within, kv_len, batch=1)
        h_top = self.block(tokens, depth, within, (self.top,), kv_len, plan)[self.top]
        return self.decoder.read(h_top, depth, within, kv_len, plan.meta.rows(1), plan.rope, plan.slots)

    @staticmethod
    def _no_logits(tokens: Tensor) -> Tensor:
        """One row's logits (the forward computes some; the states are what is wanted)."""
        return torch.zeros(1, dtype=torch.long, device=tokens.device)
