"""Exact offline tau at temperature 0 ("replay"): the decode loop without a target forward per round.

With greedy verification, speculative decoding emits the AR greedy sequence x, and the round whose
anchor is x_n accepts the longest path of its tree that spells x_{n+1}, x_{n+2}, ... So tau needs
only the greedy continuation (generated once, batched) and one teacher-forced target pass over prompt +
continuation (the tapped states drafters read); `SpecDecoder.generate(..., reference=...)` then runs
its own rounds on them (engine.py: same loop, stop rules and drafting stages; the verify stage follows
the reference). On CUDA a device drafter's replay is the graphed device round (the drafter drafts as
in decoding). In the host walk (the CPU's default) drafters that can precompute their drafting along a
known sequence do so once per reference, shared by every tree and budget replayed on it (DFlash-family
pass 1, the self drafter's greedy chain: see `ReferencePass1` and `SelfDrafter`).

Numerics: the reference is what AR greedy decoding emits. Where the teacher-forced pass's argmax
differs from the generated token (near-ties between two logits), the real decode loop could follow
either; `Reference.tf_mismatch` counts such positions so a table can say how many there were.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

import torch
from torch import Tensor

from specbench.config import SpecConfig
from specbench.drafters.base import Drafter, TeacherForced
from specbench.engine import SpecDecoder, generate_batch
from specbench.models.target import TargetModel
from specbench.trees.base import DraftTree, TreePolicy
from specbench.verify.base import VerifyResult


@dataclass
class Reference:
    """One prompt's greedy continuation and the teacher-forced tapped states over prompt + continuation.

    tokens: the continuation, `extra` tokens past where decoding stops (the last round's walk may read
    them); output_len: tokens AR decoding emits (up to and including the first EOS, or max_new_tokens).
    """

    prompt: list[int]
    tokens: list[int]
    output_len: int
    hidden: dict[int, Tensor]  # tap -> [1, L, d] over prompt + tokens
    tf_mismatch: int  # continuation positions where the teacher-forced argmax differs from the token

    @property
    def sequence(self) -> list[int]:
        return self.prompt + self.tokens

    @cached_property
    def forced(self) -> TeacherForced:
        """What the engine replays (one object per reference: drafters key their precomputation on it)."""
        return TeacherForced(tokens=self.sequence, hidden=self.hidden)


@dataclass
class ReplayResult:
    accepted: list[int]  # draft tokens accepted per round (bonus not counted), as RoundStats.accepted
    output: list[int]  # the tokens decoding emits (equal to the reference output by construction)
    ref_exhausted: int = 0  # rounds whose walk reached the end of the reference (raise `extra`)
    tree_sizes: list[int] = field(default_factory=list)  # draft nodes per round

    @property
    def tau(self) -> float:
        return sum(a + 1 for a in self.accepted) / len(self.accepted) if self.accepted else 0.0


@torch.no_grad()
def build_references(target: TargetModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, taps: Sequence[int],
                     *, extra: int = 16, batch_size: int = 8) -> list[Reference]:
    """Greedy continuations (batched, past EOS) + one teacher-forced pass each for `taps`."""
    eos = set(target.eos_token_ids)
    out: list[Reference] = []
    for s in range(0, len(prompts), batch_size):
        chunk = [list(p) for p in prompts[s: s + batch_size]]
        conts = generate_batch(target, chunk, max_new_tokens + extra, stop_at_eos=False)
        for prompt, cont in zip(chunk, conts):
            stop = next((i + 1 for i, t in enumerate(cont[:max_new_tokens]) if t in eos), max_new_tokens)
            cont = cont[: stop + extra]
            seq = torch.tensor([prompt + cont], device=target.device)
            n = seq.shape[1]
            fwd = target.forward(seq, torch.arange(n, device=target.device)[None], target.new_cache(n), None,
                                 tuple(sorted(set(taps))), kv_len=n)
            predicted = fwd.logits[0, len(prompt) - 1: n - 1].argmax(-1)
            mismatch = int((predicted != seq[0, len(prompt):]).sum())
            out.append(Reference(prompt=prompt, tokens=cont, output_len=stop, hidden=fwd.hidden, tf_mismatch=mismatch))
    return out


def replay_decoder(drafter: Drafter, policy: TreePolicy, budget: int, max_seq_len: int | None = None,
                   replay_on_device: bool | None = None) -> SpecDecoder:
    """A greedy decoder for `drafter` under `policy` (reuse it across references: its caches stay; on CUDA,
    where it replays graphed device rounds by default, give it a drafter no other decoder uses)."""
    spec = SpecConfig(drafter=drafter.name or type(drafter).__name__, tree=policy.name, verifier="greedy", budget=budget)
    return SpecDecoder(drafter.target, spec, max_seq_len=max_seq_len, drafter=drafter, policy=policy,
                       replay_on_device=replay_on_device)


def replay(drafter: Drafter, ref: Reference, policy: TreePolicy, budget: int, max_new_tokens: int,
           decoder: SpecDecoder | None = None) -> ReplayResult:
    """The rounds greedy speculative decoding runs on `ref` (SpecDecoder's exact-replay mode); without a
    `decoder` (from `replay_decoder`, reused across references) one sized to this request."""
    if decoder is None:
        need = len(ref.prompt) + max_new_tokens + budget + 1
        decoder = replay_decoder(drafter, policy, budget, min(need, drafter.target.config.max_position_embeddings))
    if decoder.drafter is not drafter or decoder.policy is not policy or decoder.spec.budget != budget:
        raise ValueError("replay: the decoder was built for another drafter, policy or budget")
    seq = ref.sequence
    n = len(ref.prompt)
    exhausted = 0

    def on_round(_: int, tree: DraftTree, res: VerifyResult) -> None:
        nonlocal n, exhausted
        exhausted += int(n + len(res.path) >= len(seq) and bool(tree.children[res.path[-1]]))
        n += len(res.path)

    out = decoder.generate(ref.prompt, max_new_tokens, on_round=on_round, reference=ref.forced)
    rounds = out.stats.rounds
    return ReplayResult(accepted=[r.accepted for r in rounds], output=out.tokens, ref_exhausted=exhausted,
                        tree_sizes=[r.tree_size for r in rounds])


__all__ = ["Reference", "ReplayResult", "build_references", "replay", "replay_decoder"]
