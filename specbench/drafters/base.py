"""The `Drafter` interface and the state the engine shares with it each round.

A drafter proposes a `DraftTree` whose root is the anchor. A parallel drafter (DFlash, JetSpec) makes
per-depth scores and calls `policy.build`; an autoregressive drafter expands depth by depth and asks
the policy to `select`. `taps` names the target layers whose outputs the drafter reads: the engine
requests them from the prefill and from every verification forward and hands them to `begin` and
`observe`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor

from specbench.config import SamplingConfig
from specbench.models.decoder import ForwardOutput
from specbench.models.target import TargetModel
from specbench.trees.base import DraftTree, TreePolicy
from specbench.verify.base import Acceptance, Randomness, VerifyResult


@dataclass
class DraftState:
    """Committed tokens of one request (prompt + generated; tokens[-1] is the anchor) and settings.

    The target's KV cache holds every committed token but the anchor: cache_len = len(tokens) - 1.
    want_draft_probs: the verifier reads draft distributions, so a drafter that can sample should
    sample from its processed law and record it in `tree.draft_probs`.
    """

    tokens: list[int]
    prompt_len: int
    sampling: SamplingConfig
    draft_rng: Randomness  # the drafter's own random stream (independent of verification)
    want_draft_probs: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    anchor_device: Tensor | None = None  # [1] int64 on the target's device, kept equal to tokens[-1] by the engine

    @property
    def anchor(self) -> int:
        return self.tokens[-1]

    def anchor_on(self, device: torch.device) -> Tensor:
        """The anchor as a [1] device tensor: the engine's buffer when there is one (no host copy, so a
        captured graph reads each round's anchor), else a fresh copy of tokens[-1]."""
        if self.anchor_device is not None and self.anchor_device.device == torch.device(device):
            return self.anchor_device
        return torch.full((1,), self.anchor, dtype=torch.long, device=device)

    @property
    def cache_len(self) -> int:
        return len(self.tokens) - 1


Phase = tuple[str, Callable[[Any], Any]]
"""(stage name, step): one piece of a round's drafting; the step maps the previous piece's output to
the next (the first gets None, the last returns the DraftTree). The stage name ("draft" or "tree")
says where its time is charged."""


class Drafter(ABC):
    """Proposes draft trees. Built as `Drafter(target, **drafter_args)`.

    Host drafters (the default) draft from the host-side state (`state.tokens`) after each round's
    result is read back. Device drafters (`capturable`) draft and `observe` in tensor ops on the
    target's device with static shapes and no host read, so the GPU round captures their `phases` and
    `observe` in CUDA graphs (and may start a round before the previous one has been read).
    """

    name: ClassVar[str] = ""
    #: Tree policies this drafter can work with (None = any).
    policies: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, target: TargetModel) -> None:
        self.target = target
        self.cuda_graphs = True  # a host drafter may replay its own forwards from CUDA graphs (the engine sets it)

    @property
    def taps(self) -> tuple[int, ...]:
        """Target layer indices whose outputs this drafter reads (empty: none)."""
        return ()

    def begin(self, state: DraftState, prefill: ForwardOutput, max_seq_len: int) -> None:
        """A new request: `prefill` holds the prompt's tapped hidden states (all prompt positions);
        `max_seq_len` is the number of cache slots the target's cache has."""

    @abstractmethod
    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        """A tree with node 0 = state.anchor and at most `budget` further nodes."""

    def phases(self, state: DraftState, policy: TreePolicy, budget: int) -> list[Phase]:
        """The round's drafting as stages (see `Phase`); running them in order is `draft`. Default: one
        "draft" stage."""
        return [("draft", lambda _: self.draft(state, policy, budget))]

    def capturable(self, policy: TreePolicy) -> bool:
        """True when `phases` and `observe` (given an `Acceptance`) are device-only under `policy` at
        temperature 0: static shapes, no host read, state in buffers allocated once (`begin`)."""
        return False

    def graph_state(self) -> list[Tensor]:
        """The small device tensors a round mutates (lengths, counters): saved and restored around a
        CUDA-graph capture, whose warm-up runs the round's steps for real."""
        return []

    @property
    def foresees(self) -> bool:
        """Whether the engine should call `foresee` every round."""
        return False

    def foresee(self, state: DraftState, tree: DraftTree) -> None:
        """Work for the next round that runs beside this round's verification (JetSpec++'s foresight):
        called once per round, after the verify forward of `tree` (the drafter's own tree) has been
        enqueued and before its result is read. It may only enqueue work (on a stream of its own) and
        must not read anything verification decides; `observe` follows as usual."""

    def observe(self, tree: DraftTree, result: VerifyResult | Acceptance, target_out: ForwardOutput) -> None:
        """After verification: the accepted node ids (root first) of `tree` — a host `VerifyResult`, or
        for a capturable drafter in the GPU round an `Acceptance` (device tensors, not yet read);
        `target_out.hidden` holds the tapped states of every tree node."""
