"""Held-out validation while training: every head's loss and top-1 agreement on fixed batches of
validation sequences, and its tau by exact replay (specbench.bench.replay) on a few validation prompts.

The validation sequences are the greedy responses of prompts held out of training (see
`corpus.split_validation`), so a head's `acc` there is its agreement with the target's argmax. The
batches and their anchors are fixed (one generator seed per batch), so successive points of the curve
differ only by the heads' weights; nothing here touches the trainer's own generator or data position.
Replay references (the target's greedy continuation and its tapped states) are computed once.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Sequence

import torch

from specbench.models.target import TargetModel
from specbench.train.objective import read_metrics
from specbench.train.sequences import TokenStore

if TYPE_CHECKING:
    from specbench.train.trainer import Trainer

DEFAULT_TREES = {"eagle3": "eagle2"}  # every other head: ddtree


class Validator:
    def __init__(self, target: TargetModel, store: TokenStore, *, batch_size: int, max_len: int, seed: int = 0,
                 max_sequences: int | None = None, tau_prompts: int = 0, tau_budgets: Sequence[int] = (16, 64),
                 tau_max_new_tokens: int = 128) -> None:
        from specbench.train.trainer import SequenceBatches

        self.target, self.seed = target, seed
        self.data = SequenceBatches(store, batch_size, max_len, seed)
        usable = self.data.usable.tolist()[: max_sequences or None]
        self.batches = [usable[s: s + batch_size] for s in range(0, len(usable), batch_size)]
        seen: dict[int, None] = {}
        for i in usable:  # distinct prompts, in order, for replay
            seen.setdefault(int(store.prompt_of[i]), None)
        self.tau_prompt_index = [p for p in seen][:tau_prompts]
        self.store = store
        self.tau_budgets = tuple(int(b) for b in tau_budgets)
        self.tau_max_new_tokens = tau_max_new_tokens
        self.references: list[Any] | None = None
        self.skipped: set[str] = set()

    @property
    def num_sequences(self) -> int:
        return sum(len(b) for b in self.batches)

    @torch.no_grad()
    def losses(self, trainer: "Trainer") -> dict[str, float]:
        """val/<label>/<metric>: each objective's loss and metrics, averaged over the fixed batches
        (weighted by sequences per batch)."""
        from specbench.train.trainer import target_batch

        sums: dict[str, float] = {}
        weight = 0
        for k, idx in enumerate(self.batches):
            tokens, valid, loss_mask = self.data.collate(idx, torch.device("cpu"))
            batch = target_batch(self.target, tokens, valid, loss_mask, trainer.taps)
            for name, obj in trainer.objectives.items():
                loss, parts = obj.loss(batch, torch.Generator().manual_seed(self.seed * 7919 + k))
                for key, value in read_metrics({"loss": loss, **parts}).items():
                    if value == value:  # NaN parts (e.g. no label of a kind in this batch) are left out
                        sums[f"val/{name}/{key}"] = sums.get(f"val/{name}/{key}", 0.0) + value * len(idx)
            weight += len(idx)
        return {k: v / max(weight, 1) for k, v in sums.items()}

    def _references(self, taps: Sequence[int]) -> list[Any]:
        from specbench.bench.replay import build_references

        if self.references is None:
            prompts = [self.store.prompt_tokens[self.store.prompt_offsets[p]: self.store.prompt_offsets[p + 1]].tolist()
                       for p in self.tau_prompt_index]
            self.references = build_references(self.target, prompts, self.tau_max_new_tokens, taps, batch_size=8)
        return self.references

    @torch.no_grad()
    def tau(self, trainer: "Trainer") -> dict[str, float]:
        """val/<label>/tau<budget>: mean tau per prompt at temperature 0 of each head (as it is now),
        by exact replay under its default tree policy."""
        from specbench.bench.replay import replay
        from specbench.drafters import DRAFTERS
        from specbench.trees import TREE_POLICIES

        if not self.tau_prompt_index or not self.tau_budgets:
            return {}
        refs = self._references(trainer.taps)
        out: dict[str, float] = {}
        for name, obj in trainer.objectives.items():
            if name in self.skipped:
                continue
            try:
                drafter = DRAFTERS.get(obj.drafter)(self.target, head=copy.deepcopy(obj.head))
            except Exception as exc:  # a head whose drafter cannot run a live head: say so once, go on
                print(f"validation: no tau for {name} ({obj.drafter!r} drafter: {type(exc).__name__}: {exc})")
                self.skipped.add(name)
                continue
            policy = TREE_POLICIES.build(DEFAULT_TREES.get(obj.drafter, "ddtree"))
            taus: dict[int, list[float]] = {b: [] for b in self.tau_budgets}
            for ref in refs:  # the drafter's pass 1 along a reference is computed once for every budget
                for b in sorted(self.tau_budgets, reverse=True):
                    taus[b].append(replay(drafter, ref, policy, b, self.tau_max_new_tokens).tau)
            out.update({f"val/{name}/tau{b}": sum(v) / len(v) for b, v in taus.items()})
        return out
