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
from typing import Any, ClassVar

from specbench.config import ConfigError, SamplingConfig
from specbench.models.decoder import ForwardOutput
from specbench.models.target import TargetModel
from specbench.trees.base import DraftTree, TreePolicy
from specbench.verify.base import Randomness, VerifyResult


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

    @property
    def anchor(self) -> int:
        return self.tokens[-1]

    @property
    def cache_len(self) -> int:
        return len(self.tokens) - 1


class Drafter(ABC):
    """Proposes draft trees. Built as `Drafter(target, **drafter_args)`."""

    name: ClassVar[str] = ""
    #: Tree policies this drafter can work with (None = any).
    policies: ClassVar[tuple[str, ...] | None] = None
    #: Tree policies it can work with when it samples its draft (the verifier reads draft
    #: probabilities, T > 0); None = the same as `policies`.
    sampled_policies: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, target: TargetModel) -> None:
        self.target = target

    @classmethod
    def check_policy(cls, tree: str, sampled: bool = False) -> None:
        """ConfigError, listing the policies this drafter can use, unless it can use the policy `tree`
        (`sampled`: when drafting by sampling). Needs no model: callers check before loading one."""
        allowed = cls.sampled_policies if sampled and cls.sampled_policies is not None else cls.policies
        if allowed is None or tree in allowed:
            return
        name = cls.name or cls.__name__
        if not sampled:
            raise ConfigError(f"drafter {name!r} cannot draft with tree={tree!r}; the policies it can: "
                              f"{', '.join(allowed)}", keys=("tree",))
        raise ConfigError(
            f"drafter {name!r} cannot draft with tree={tree!r} when it samples its draft (rejection-sampling rules "
            f"read draft probabilities at T > 0); the policies it can then: {', '.join(allowed)}. To keep that "
            f"policy, verify with verifier=sample-walk or verifier=tree-rrs-pointmass", keys=("tree", "verifier"))

    @property
    def taps(self) -> tuple[int, ...]:
        """Target layer indices whose outputs this drafter reads (empty: none)."""
        return ()

    def begin(self, state: DraftState, prefill: ForwardOutput, max_seq_len: int) -> None:
        """A new request: `prefill` holds the prompt's tapped hidden states (all prompt positions)."""

    @abstractmethod
    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        """A tree with node 0 = state.anchor and at most `budget` further nodes."""

    def observe(self, tree: DraftTree, result: VerifyResult, target_out: ForwardOutput) -> None:
        """After verification: `result.path` are the accepted node ids (root first) of `tree`;
        `target_out.hidden` holds the tapped states of every tree node."""
