"""`HeadDrafter`: what every DFlash-family drafter shares: loading the head, the draft-side cache of
verified-context K/V, and running a block (MASK or concrete inputs) against it.

Draft-side cache (docs/methods.md, "The draft-side cache"): per draft layer, the K/V of the fused context feature of every
verified position, written exactly once. `begin` writes the prompt's; `observe` writes those of the
verify pass's accepted nodes (root + path), which are the next committed positions, so the cache's
length always equals the target's (every committed token but the anchor). A block's own K/V are
scratch slots past the committed prefix, overwritten by the next round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, ClassVar, NamedTuple

import torch
from torch import Tensor

from specbench.config import ConfigError
from specbench.drafters.base import Drafter, DraftState, Weights
from specbench.drafters.heads.backbone import DraftHead, HeadConfig, default_taps
from specbench.drafters.heads.checkpoint import HeadCheckpointError, default_head_dir, load_head, train_hint
from specbench.drafters.heads.masks import block_pattern
from specbench.kernels.masks import pack_tree_mask
from specbench.models.decoder import AttentionMeta, ForwardOutput, KVCache, Transformer
from specbench.models.target import TargetModel
from specbench.trees.base import DraftTree
from specbench.verify.base import Acceptance, VerifyResult


def load_trained_head(drafter: str, target: TargetModel, checkpoint: str | Path | None = None) -> DraftHead:
    """The head in `checkpoint`, or the one shipped for (drafter, target) in specbench/heads/."""
    directory = Path(checkpoint) if checkpoint is not None else default_head_dir(drafter, target.name)
    if checkpoint is None and not directory.is_dir():
        raise HeadCheckpointError(
            f"no trained {drafter!r} head ships for target {target.name!r} (looked in {str(directory)!r}). Train one "
            f"with {train_hint(drafter, target)} and pass drafter_args checkpoint=DIR/heads/{drafter}",
            keys=("drafter_args",))
    state, config = load_head(directory, target)
    head = DraftHead(target.config, HeadConfig.from_dict(config))
    head.load_state_dict(state)
    return head


class BlockPlan(NamedTuple):
    """One block read's shared pieces: attention meta (its lengths: the committed length of every row
    read), positions [1, Q], cos/sin at them, the scratch slots [1, Q] its rows' K/V go to."""

    meta: AttentionMeta
    positions: Tensor
    rope: tuple[Tensor, Tensor]
    slots: Tensor


def write_committed(head: DraftHead, cache: KVCache, features: Tensor, count: Tensor, model: Transformer,
                    positions: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None) -> None:
    """Context K/V of features [1, L, m*d] of the next L committed positions, of which the first count [1]
    are real, into `cache` (a KV-injection head's: the draft head's, or a jetspec++ adapter module's):
    slots len .. len+L-1 (the rest land past the new length, free), then len += count. No host read; the
    target's layer ops throughout (the fusion's norm one kernel on CUDA, as in every other inference pass).
    positions: those slots [1, L] and rope `head.rope(positions)`, if the caller has them."""
    if positions is None:
        positions = cache.lengths[:, None] + torch.arange(features.shape[1], device=features.device)
    head.write_context(features, positions, cache, model, rope=rope, fused=True)
    cache.advance_device(count)


def random_head(drafter: str, attention: str, clean_next: bool, target: TargetModel, seed: int = 0) -> DraftHead:
    """An untrained head with the trainer's default shape (one layer, three taps, block 16)."""
    cfg = HeadConfig(drafter=drafter, taps=default_taps(target.config.num_layers, 3), attention=attention,
                     clean_next=clean_next)
    return DraftHead(target.config, cfg).to(target.device).init_weights(target.model, seed=seed)


class HeadDrafter(Drafter):
    """Base of the DFlash-family drafters. Built as `Drafter(target, checkpoint=DIR | head=DraftHead |
    random_init=True [seed])`; without any, the head shipped for the target is loaded.

    attention: the within-block pattern this drafter runs (must match what the head was trained with).
    Every step after `begin` is tensor ops on the device with static shapes (the anchor is read from
    `state.anchor_on(device)`, the committed length from the draft cache's device `lengths`), so the
    GPU round captures the drafter's phases and `observe` in CUDA graphs.
    """

    policies = "any"  # per-depth scores -> build (jetspec-tree also re-selects with select)
    weights = Weights(train="specbench train --drafter {drafter} --data DATA_DIR --out DIR")
    attention: ClassVar[str] = ""
    needs_clean_next: ClassVar[bool] = False

    def __init__(self, target: TargetModel, checkpoint: str | None = None, head: DraftHead | None = None,
                 block_size: int | None = None, random_init: bool = False, seed: int = 0) -> None:
        super().__init__(target)
        if head is None and random_init:
            head = random_head(self.name, self.attention, self.needs_clean_next, target, seed)
        if head is None:
            head = load_trained_head(self.name, target, checkpoint)
        cfg = head.config
        if cfg.attention != self.attention:
            raise ValueError(
                f"the {self.name!r} drafter runs {self.attention} blocks but this head was trained with "
                f"{cfg.attention} attention (a {cfg.drafter!r} head): use the matching drafter or train a {self.name} head")
        if self.needs_clean_next and not cfg.clean_next:
            raise ValueError(
                f"the {self.name!r} drafter needs a head trained on clean-prefix blocks with next-token labels "
                f"(clean_next); this {cfg.drafter!r} head was not: train one with {train_hint(self.name, target)}")
        self.head = head.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
        self.block_size = block_size if block_size is not None else cfg.block_size
        if not 2 <= self.block_size <= cfg.block_size:
            raise ConfigError(f"block_size must be in [2, {cfg.block_size}] (the size the head was trained on), got "
                              f"drafter_args block_size={self.block_size}", keys=("drafter_args",))
        self.max_path = self.block_size + 1  # accepted nodes per round, root included (a tree's depth <= block)
        self.cache: KVCache | None = None
        self.tables: dict[tuple, Tensor] = {}  # static index tables and masks of the shapes run (`table`)

    @property
    def taps(self) -> tuple[int, ...]:
        return self.head.config.taps

    def table(self, key: tuple, build: Callable[[], Tensor]) -> Tensor:
        """A tensor that depends on shapes only (a block pattern, an index table: `key` names it), built by
        `build` the first time and kept, so a round's stages read it instead of computing it (on the GPU
        the first, eager round builds it; captured replays read the same tensor: no kernels)."""
        if key not in self.tables:
            self.tables[key] = build()
        return self.tables[key]

    @property
    def context_len(self) -> int:
        """Verified positions whose features the draft cache holds (a host read)."""
        return self.cache.host_lengths[0] if self.cache is not None else 0

    def _features(self, hidden: dict[int, Tensor], rows: Tensor | slice) -> Tensor:
        """The tapped states at `rows`, concatenated in tap order: [1, k, m*d]
        (concatenated first, then one gather: two kernels, not one a tap and the concatenation)."""
        return torch.cat([hidden[t] for t in self.taps], dim=-1)[:, rows]

    def begin(self, state: DraftState, prefill: ForwardOutput, max_seq_len: int) -> None:
        head, cfg = self.head, self.target.config
        slots = max_seq_len + self.scratch_slots()
        if self.cache is None or self.cache.max_seq_len < slots:
            self.cache = KVCache(head.config.num_layers, 1, cfg.num_kv_heads, slots, cfg.head_dim, self.target.dtype,
                                 self.target.device)
        self.cache.reset()
        features = self._features(prefill.hidden, slice(None))
        n = features.shape[1]
        self.write_context(features, torch.full((1,), n, dtype=torch.long, device=features.device))

    def scratch_slots(self) -> int:
        """Draft-cache slots past `begin`'s max_seq_len: room past the committed prefix for a block read and
        a padded commit (scratch)."""
        return 2 * self.max_path + self.block_size

    def write_context(self, features: Tensor, count: Tensor, positions: Tensor | None = None,
                      rope: tuple[Tensor, Tensor] | None = None) -> None:
        """Features [1, L, m*d] of the next L committed positions, of which the first count [1] are real
        (`write_committed` into the draft cache; positions, rope: its, if the caller has them)."""
        assert self.cache is not None, "begin() was not called"
        if positions is None:
            n = features.shape[1]
            positions = self.cache.lengths[:, None] + self.table(("arange", n), lambda: torch.arange(n, device=features.device))
        if rope is None:
            rope = self.head.rope(positions, self.target.model, self.cache)
        write_committed(self.head, self.cache, features, count, self.target.model, positions, rope)

    def observe(self, tree: DraftTree, result: VerifyResult | Acceptance, target_out: ForwardOutput) -> None:
        """The verify pass's accepted nodes (root first) are the next committed positions: write their
        tapped states' context K/V (the path padded to `max_path` rows; no host read)."""
        acc = result if isinstance(result, Acceptance) else Acceptance.from_result(result, tree.num_nodes, self.target.device)
        rows = acc.path[: self.max_path].clamp(min=0)  # padding (-1): the root's states, past the new length
        self.write_context(self._features(target_out.hidden, rows), acc.count)

    def block_plan(self, state: DraftState, depth: Tensor, within: Tensor, bits: Tensor | None = None) -> BlockPlan:
        """What every head pass over block rows at depth [Q] below the anchor (within-block mask [Q, Q])
        shares: the draft cache's attention plan, the positions, RoPE and scratch slots. bits: the mask
        packed (`pack_tree_mask(within[None])`) where the caller keeps it (a static pattern), so the
        tree-attention backend does not pack it every pass."""
        assert self.cache is not None, "begin() was not called"
        cache, q = self.cache, depth.shape[0]
        # On the CPU read only the filled slots (the committed length is the state's); elsewhere the
        # whole cache, so the pass has one shape for every context length (capturable).
        kv_len = state.cache_len + q if cache.k.device.type == "cpu" else cache.max_seq_len
        positions = (cache.lengths + depth)[None]
        return BlockPlan(AttentionMeta(lengths=cache.lengths, tree_mask=within[None], kv_len=kv_len, tree_bits=bits),
                         positions,
                         self.head.rope(positions, self.target.model, cache),
                         cache.lengths[:, None] + self.table(("arange", q), lambda: torch.arange(q, device=depth.device)))

    def run_block(self, state: DraftState, tokens: Tensor, is_mask: Tensor | None, depth: Tensor, within: Tensor,
                  plan: BlockPlan | None = None, log_probs: bool = True) -> Tensor:
        """One head pass over Q block inputs (tokens, is_mask [Q] (None: no MASK row), depth [Q] below the
        anchor) with the within-block mask [Q, Q] against the draft cache; returns log-probs [Q, V] (fp32).
        plan: `block_plan(state, depth, within)` (or one over caches of the same committed length), if
        the caller has it (passes over the same rows share it). log_probs False: the raw logits [Q, V] in
        the head's dtype (a pass read by its argmax only: no fp32 cast, no log-softmax)."""
        assert self.cache is not None, "begin() was not called"
        model = self.target.model
        plan = plan if plan is not None else self.block_plan(state, depth, within)
        x = self.head.embed_block(tokens[None], None if is_mask is None else is_mask[None], model)
        hidden = self.head.forward_cached(x, plan.positions, self.cache, plan.meta, model, plan.rope, plan.slots)[0]
        logits = self.head.logits(hidden, model.lm_head.weight)  # [Q, V]
        # dtype=: the fp32 cast happens inside the softmax kernel on CUDA (one [Q, V] pass fewer)
        return torch.log_softmax(logits, dim=-1, dtype=torch.float32) if log_probs else logits

    def block_logp(self, state: DraftState, plan: BlockPlan | None = None) -> Tensor:
        """The MASK pass: [anchor, MASK x (b-1)] -> per-depth log-probs [b-1, V] (offset j predicts depth j);
        plan: `run_block`'s, over depth 0..b-1 and the head's block pattern."""
        b, dev = self.block_size, self.target.device
        tokens = state.anchor_on(dev).expand(b)
        offsets = self.table(("offsets", b), lambda: torch.arange(b, device=dev))
        is_mask = self.table(("MASK rows", b), lambda: offsets > 0)
        if plan is None:  # the head's block pattern and its packed bits: kept, read by every round
            within = self.table(("block pattern", b, self.attention), lambda: block_pattern(b, self.attention, dev))
            bits = self.table(("block bits", b, self.attention), lambda: pack_tree_mask(within[None]))
            plan = self.block_plan(state, offsets, within, bits)
        return self.run_block(state, tokens, is_mask, offsets, plan.meta.tree_mask[0], plan)[1:]
