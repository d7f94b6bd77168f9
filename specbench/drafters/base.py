"""The `Drafter` interface, what each drafter declares, and the state the engine shares with it each round.

A drafter proposes a `DraftTree` whose root is the anchor. A parallel drafter (DFlash, JetSpec) makes
per-depth scores and calls `policy.build`; an autoregressive drafter grows the tree through
`policy.grow` (or `trees.grow.grow_tree`); a drafter with its own candidates asks `policy.select`.
Every drafter declares, as class attributes without defaults (a subclass that omits one fails when it
is defined):

  policies  the tree policies it works with: "any" (it calls build/select, which every policy has),
            "growing" (it calls grow: the policies with can_grow), or a tuple of policy names
            (`sampled_policies`, optional: those it can use when it samples its draft at T > 0)
  taps      the target layers whose outputs it reads: the engine requests them from the prefill and
            from every verification forward and hands them to `begin` and `observe` (a property when
            they depend on the loaded weights; () for none)
  weights   None (training-free) or `Weights`: it then loads the head shipped for the target (or
            drafter_args checkpoint=DIR) and accepts random_init=True for an untrained instance

Host drafters (the default) draft from the host-side state (`state.tokens`) after each round's result
is read back. Device drafters (`capturable`) draft and `observe` in tensor ops on the target's device
with static shapes and no host read, so the GPU round captures their `phases` and `observe` in CUDA
graphs (and may start a round before the previous one has been read).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor

from specbench.config import ConfigError, SamplingConfig
from specbench.models.decoder import ForwardOutput
from specbench.models.target import TargetModel
from specbench.registry import require_declared
from specbench.trees.base import DraftTree, TreePolicy
from specbench.verify.base import Acceptance, Randomness, VerifyResult


@dataclass(eq=False)
class TeacherForced:
    """A request whose greedy continuation is known ahead (exact replay, the engine's reference mode):
    `tokens` = prompt + continuation and the target's teacher-forced tapped states over them. The engine
    then runs no target forward: verification follows `tokens` and `observe` gets these states at the
    accepted nodes. A drafter may precompute from it (once per object: several trees and budgets are
    replayed on one reference) what its drafting reads along `tokens`, if it then drafts the same trees."""

    tokens: list[int]
    hidden: dict[int, Tensor]  # tap -> [1, L, d] over tokens


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
    reference: TeacherForced | None = None  # exact replay: the known continuation (tokens extends a prefix of it)

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


@dataclass(frozen=True)
class Weights:
    """Where a drafter's trained weights come from: without drafter_args checkpoint=DIR it loads the
    head shipped in specbench/heads/<drafter>-<target>/ (`shipped_dir`); `train` is the command that
    trains one ("{drafter}" stands for the drafter's name). random_init=True builds an untrained
    instance instead (tests, cost measurements). `calibrate`: the drafter_args under which drafting
    reads every trained weight (what `specbench head-convert --calibrate` drafts with to round the head
    to int4 by GPTQ on its own inputs)."""

    train: str
    calibrate: dict[str, Any] = field(default_factory=dict)

    def train_command(self, drafter: str) -> str:
        return self.train.format(drafter=drafter)

    def shipped_dir(self, drafter: str, target_name: str) -> Path:
        from specbench.drafters.heads.checkpoint import default_head_dir

        return default_head_dir(drafter, target_name)


Phase = tuple[str, Callable[[Any], Any]]
"""(stage name, step): one piece of a round's drafting; the step maps the previous piece's output to
the next (the first gets None, the last returns the DraftTree). The stage name ("draft" or "tree")
says where its time is charged."""


class Drafter(ABC):
    """Proposes draft trees. Built as `Drafter(target, **drafter_args)`; declares `policies`, `taps`
    and `weights` (module docstring)."""

    name: ClassVar[str] = ""
    policies: ClassVar[tuple[str, ...] | str]
    #: Tree policies it can work with when it samples its draft (the verifier reads draft
    #: probabilities, T > 0); None = the same as `policies`.
    sampled_policies: ClassVar[tuple[str, ...] | None] = None
    weights: ClassVar[Weights | None]
    taps: tuple[int, ...]  # a class attribute or a property

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        require_declared(cls, Drafter, {
            "policies": '`policies = "any"` (it calls build/select), `policies = "growing"` (it calls grow) or a '
                        'tuple of tree policy names',
            "taps": "`taps = ()` or the target layers it reads (a property when they depend on its weights)",
            "weights": "`weights = None` (training-free) or `weights = Weights(train=...)`",
        })
        spec = cls.__dict__.get("policies")
        if spec is not None and not (spec in ("any", "growing") or (isinstance(spec, tuple) and spec
                                                                    and all(isinstance(n, str) for n in spec))):
            raise TypeError(f"{cls.__qualname__}.policies must be 'any', 'growing' or a tuple of tree policy names, "
                            f"got {spec!r}")

    def __init__(self, target: TargetModel) -> None:
        self.target = target
        self.cuda_graphs = True  # a host drafter may replay its own forwards from CUDA graphs (the engine sets it)
        self.graphs_of: Any = None  # weakref to the decoder whose CUDA graphs hold this drafter's buffers (the engine's)

    @classmethod
    def works_with(cls, policy: TreePolicy | type[TreePolicy]) -> bool:
        """Whether this drafter can draft under `policy` (a policy or its class), per `policies`."""
        if cls.policies == "any":
            return True
        if cls.policies == "growing":
            return policy.can_grow
        return policy.name in cls.policies

    @classmethod
    def policy_names(cls) -> list[str]:
        """The registered tree policies this drafter works with."""
        from specbench.trees import TREE_POLICIES

        return [n for n in TREE_POLICIES.names() if cls.works_with(TREE_POLICIES.get(n))]

    @classmethod
    def check_policy(cls, tree: str | TreePolicy | type[TreePolicy], sampled: bool = False) -> None:
        """ConfigError, listing the policies this drafter can use, unless it can use `tree` (a policy, its
        class, or a registered name; `sampled`: when drafting by sampling). Needs no model: callers
        check before loading one."""
        if isinstance(tree, str):
            from specbench.trees import TREE_POLICIES

            policy = TREE_POLICIES.get(tree)
        else:
            policy = tree
        name, drafter = policy.name, cls.name or cls.__name__
        if sampled and cls.sampled_policies is not None:
            if name in cls.sampled_policies:
                return
            raise ConfigError(
                f"drafter {drafter!r} cannot draft with tree={name!r} when it samples its draft (rejection-sampling "
                f"rules read draft probabilities at T > 0); the policies it can then: {', '.join(cls.sampled_policies)}. "
                f"To keep that policy, verify with verifier=sample-walk or verifier=tree-rrs-pointmass",
                keys=("tree", "verifier"))
        if not cls.works_with(policy):
            raise ConfigError(f"drafter {drafter!r} cannot draft with tree={name!r}; the policies it can: "
                              f"{', '.join(cls.policy_names())}", keys=("tree",))

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

    @property
    def foresees(self) -> bool:
        """Whether the engine should call `foresee` every round."""
        return False

    def foresee(self, state: DraftState, tree: DraftTree) -> None:
        """Work for the next round that runs beside this round's verification (JetSpec++'s foresight):
        called once per round, after the verify forward of `tree` (the drafter's own tree) has been
        enqueued and before its result is read. It may only enqueue work (on a stream of its own) and
        must not read anything verification decides; `observe` follows as usual."""

    # ---- device drafters whose next round depends on this one's readout -----------------------
    @property
    def branches(self) -> bool:
        """Whether the next round's `phases` depend on a flag read with this round's readout
        (`branch_flag`): the engine then reads each round before launching the next (no lookahead)
        and captures each branch's stages once, keyed by `branch`."""
        return False

    @property
    def branch(self) -> str:
        """Which of its stage lists `phases` returns next (the engine's capture key)."""
        return ""

    def branch_flag(self) -> Tensor:
        """[1] int64 on the target's device, written by `observe` in the commit stage (captured)."""
        raise NotImplementedError(f"{self.name} does not branch")

    def read_branch(self, flag: int) -> None:
        """The flag as read with the round's readout: it picks the next round's `phases`."""

    def side_phase(self, state: DraftState, policy: TreePolicy, budget: int) -> Phase | None:
        """A capturable stage that reads the round's tree (not its verification) and runs beside the
        verify forward, on `side_stream` where there is one; `observe` follows it. None: none."""
        return None

    @property
    def side_stream(self) -> "torch.cuda.Stream | None":
        return None

    def observe(self, tree: DraftTree, result: VerifyResult | Acceptance, target_out: ForwardOutput) -> None:
        """After verification: the accepted node ids (root first) of `tree` — a host `VerifyResult`, or
        for a capturable drafter in the GPU round an `Acceptance` (device tensors, not yet read);
        `target_out.hidden` holds the tapped states of every tree node."""
