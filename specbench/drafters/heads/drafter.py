"""`HeadDrafter`: what every DFlash-family drafter shares: loading the head, the draft-side cache of
verified-context K/V, and running a block (MASK or concrete inputs) against it.

Draft-side cache (docs/methods.md, "The draft-side cache"): per draft layer, the K/V of the fused
context feature of every verified position, written exactly once. `begin` queues the prompt's tapped states; `observe` queues
the tapped states of the verify pass's accepted nodes (root + path), which are the next committed
positions; the next `draft` writes the queue into the cache (so its length equals the target's cache
length, i.e. every committed token but the anchor). Block K/V are computed per round and never kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from specbench.drafters.base import Drafter, DraftState, Weights
from specbench.drafters.heads.backbone import DraftHead, HeadConfig, default_taps
from specbench.drafters.heads.checkpoint import HeadCheckpointError, default_head_dir, load_head
from specbench.drafters.heads.masks import block_pattern
from specbench.models.decoder import ForwardOutput, KVCache
from specbench.models.target import TargetModel
from specbench.trees.base import DraftTree
from specbench.verify.base import VerifyResult


def load_trained_head(drafter: str, target: TargetModel, checkpoint: str | Path | None = None) -> DraftHead:
    """The head in `checkpoint`, or the one shipped for (drafter, target) in specbench/heads/."""
    directory = Path(checkpoint) if checkpoint is not None else default_head_dir(drafter, target.name)
    if checkpoint is None and not directory.is_dir():
        raise HeadCheckpointError(
            f"no trained {drafter!r} head ships for target {target.name!r} (looked in {str(directory)!r}). Train one "
            f"with `specbench train --drafter {drafter} --target {target.name} --data DATA_DIR --out DIR` and pass "
            f"drafter_args checkpoint=DIR/heads/{drafter} (CLI: --drafter-arg checkpoint=DIR/heads/{drafter})")
    state, config = load_head(directory, target)
    head = DraftHead(target.config, HeadConfig.from_dict(config))
    head.load_state_dict(state)
    return head


def head_logp(head: DraftHead, target: TargetModel, ctx_kv: list[tuple[Tensor, Tensor]], tokens: Tensor,
              is_mask: Tensor, depth: Tensor, within: Tensor) -> Tensor:
    """One head pass of a single block/tree against context K/V of n positions (all visible):
    tokens, is_mask, depth [Q] (positions n + depth), within [Q, Q] -> log-probs [Q, V] (fp32)."""
    model = target.model
    n = ctx_kv[0][0].shape[2]
    q = tokens.shape[0]
    mask = torch.cat([torch.ones(q, n, dtype=torch.bool, device=within.device), within], dim=1)[None]
    x = head.embed_block(tokens[None], is_mask[None], model)
    hidden = head(x, (n + depth)[None], ctx_kv, mask, model)[0]  # [Q, d]
    return torch.log_softmax(head.logits(hidden, model.lm_head.weight).float(), dim=-1)


def random_head(drafter: str, attention: str, clean_next: bool, target: TargetModel, seed: int = 0) -> DraftHead:
    """An untrained head with the trainer's default shape (one layer, three taps, block 16)."""
    cfg = HeadConfig(drafter=drafter, taps=default_taps(target.config.num_layers, 3), attention=attention,
                     clean_next=clean_next)
    return DraftHead(target.config, cfg).to(target.device).init_weights(target.model, seed=seed)


class HeadDrafter(Drafter):
    """Base of the DFlash-family drafters. Built as `Drafter(target, checkpoint=DIR | head=DraftHead |
    random_init=True [seed])`; without any, the head shipped for the target is loaded.

    attention: the within-block pattern this drafter runs (must match what the head was trained with).
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
                f"(clean_next); this {cfg.drafter!r} head was not: train one with `specbench train --drafter {self.name}`")
        self.head = head.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
        self.block_size = block_size if block_size is not None else cfg.block_size
        if not 2 <= self.block_size <= cfg.block_size:
            raise ValueError(f"block_size must be in [2, {cfg.block_size}] (the size the head was trained on), got {self.block_size}")
        self.cache: KVCache | None = None
        self.pending: list[Tensor] = []  # [1, k, m*d] tapped features of committed positions not yet cached

    @property
    def taps(self) -> tuple[int, ...]:
        return self.head.config.taps

    @property
    def context_len(self) -> int:
        """Verified positions whose features the draft cache holds."""
        return self.cache.host_lengths[0] if self.cache is not None else 0

    def _features(self, hidden: dict[int, Tensor], rows: list[int] | slice) -> Tensor:
        """The tapped states at `rows`, concatenated in tap order: [1, k, m*d]."""
        return torch.cat([hidden[t][:, rows] for t in self.taps], dim=-1)

    def begin(self, state: DraftState, prefill: ForwardOutput, max_seq_len: int) -> None:
        head, cfg = self.head, self.target.config
        if self.cache is None or self.cache.max_seq_len < max_seq_len:
            self.cache = KVCache(head.config.num_layers, 1, cfg.num_kv_heads, max_seq_len, cfg.head_dim,
                                 self.target.dtype, self.target.device)
        self.cache.reset()
        self.pending = [self._features(prefill.hidden, slice(None))]

    def observe(self, tree: DraftTree, result: VerifyResult, target_out: ForwardOutput) -> None:
        self.pending.append(self._features(target_out.hidden, list(result.path)))

    def _sync_context(self, state: DraftState) -> None:
        """Write the queued features into the draft cache (each committed position exactly once)."""
        assert self.cache is not None, "begin() was not called"
        start = self.context_len
        feats = torch.cat(self.pending, dim=1) if len(self.pending) > 1 else self.pending[0]
        end = start + feats.shape[1]
        if end != state.cache_len:
            raise RuntimeError(f"draft cache out of step: {end} context features for {state.cache_len} committed tokens")
        if end > start:
            positions = torch.arange(start, end, device=feats.device)[None]
            for i, (k, v) in enumerate(self.head.context_kv(feats, positions, self.target.model)):
                self.cache.k[i, :, :, start:end] = k
                self.cache.v[i, :, :, start:end] = v
            self.cache.advance(end - start)
        self.pending = [feats[:, :0]]

    def context_kv(self) -> list[tuple[Tensor, Tensor]]:
        """The cached context K/V per draft layer: [1, Hkv, n, D] views."""
        assert self.cache is not None
        n = self.context_len
        return [(self.cache.k[i, :, :, :n], self.cache.v[i, :, :, :n]) for i in range(self.head.config.num_layers)]

    def run_block(self, state: DraftState, tokens: Tensor, is_mask: Tensor, depth: Tensor, within: Tensor) -> Tensor:
        """One head pass over Q block inputs (tokens, is_mask [Q], depth [Q] below the anchor) with the
        within-block mask [Q, Q], after syncing the context; returns log-probs [Q, V] (fp32)."""
        self._sync_context(state)
        return head_logp(self.head, self.target, self.context_kv(), tokens, is_mask, depth, within)

    def block_logp(self, state: DraftState) -> Tensor:
        """The MASK pass: [anchor, MASK x (b-1)] -> per-depth log-probs [b-1, V] (offset j predicts depth j)."""
        b, dev = self.block_size, self.target.device
        tokens = torch.full((b,), state.anchor, dtype=torch.long, device=dev)
        is_mask = torch.arange(b, device=dev) > 0
        logp = self.run_block(state, tokens, is_mask, torch.arange(b, device=dev), block_pattern(b, self.attention, dev))
        return logp[1:]
