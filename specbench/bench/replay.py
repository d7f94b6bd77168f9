"""Exact offline tau at temperature 0 ("replay"), without running the decode loop.

With greedy verification, speculative decoding emits the AR greedy sequence x, and the round whose
anchor is x_n accepts the longest path of its tree that spells x_{n+1}, x_{n+2}, ... So tau needs
only: the greedy continuation (generated once), one teacher-forced target pass over prompt +
continuation (the tapped states the drafter reads), and the drafter's proposal at every anchor the
rounds visit. Rounds are then simulated exactly as `SpecDecoder` runs them (same stop rules, same
per-round accepted counts, the walk may run past EOS / the length limit as the real one does).

Proposals:
* DFlash-family heads (fast path): pass 1 (anchor + MASK block) of every anchor of the output is
  computed in a few block-masked passes over the sequence (like training: context strictly before
  each anchor), keeping the top-K log-probs per depth (K >= every budget; tree policies read only
  their top-`budget` / top-`width` entries, the rest is filled far below). jetspec-tree's second pass
  runs at each visited anchor against the context K/V of the positions before it.
* `self` under `chain` (fast path): a greedy chain drafted along the reference is, token for token,
  the shallow model's teacher-forced argmax, up to and including the first token that differs from
  the reference; the walk never reads past that token. So one teacher-forced shallow pass over the
  sequence gives every round's chain (only its prefix up to the first rejected token is built).
* Any other drafter (ngram, self under a growing policy, eagle3, jetspec++, ...): its own
  begin/draft/(foresee)/observe, where `observe` gets the teacher-forced tapped states at the
  accepted nodes (the rows it is entitled to read; others NaN).

Numerics: the reference is what AR greedy decoding emits. Where the teacher-forced pass's argmax
differs from the generated token (near-ties between two logits), the real decode loop could follow
either; `ReplayResult.tf_mismatch` counts such positions so a table can say how many there were.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor

from specbench.config import SamplingConfig
from specbench.drafters.base import Drafter, DraftState
from specbench.drafters.heads.drafter import head_logp
from specbench.drafters.heads.masks import uniform_blocks_mask
from specbench.drafters.heads.jetspec_tree import JetSpecTreeDrafter
from specbench.drafters.heads.parallel import ParallelHeadDrafter
from specbench.drafters.self_draft import SelfDrafter
from specbench.models.decoder import ForwardOutput
from specbench.models.target import TargetModel
from specbench.engine import generate_batch
from specbench.trees.base import DepthScores, DraftTree, TreePolicy
from specbench.verify.base import TorchRandomness, VerifyResult

FILL_LOGP = -1.0e9  # entries below a proposal's top-K (never read by top-B / top-width policies)


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


@dataclass
class ReplayResult:
    accepted: list[int]  # draft tokens accepted per round (bonus not counted), as RoundStats.accepted
    output: list[int]  # the tokens decoding emits (equal to the reference output by construction)
    ref_exhausted: int = 0  # rounds whose walk reached the end of the reference (raise `extra`)
    meta: dict[str, Any] = field(default_factory=dict)

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


def walk(tree: DraftTree, reference: Sequence[int], start: int) -> tuple[list[int], bool]:
    """Greedy walk: node path from the root following reference[start], reference[start+1], ...;
    also whether the walk ran off the end of the reference."""
    tokens, _, _ = tree.host
    children = tree.children
    node, path = 0, [0]
    while True:
        pos = start + len(path) - 1
        if pos >= len(reference):
            return path, bool(children[node])
        nxt = next((c for c in children[node] if tokens[c] == reference[pos]), None)
        if nxt is None:
            return path, False
        node = nxt
        path.append(node)


def simulate(ref: Reference, max_new_tokens: int, eos: set[int], propose) -> ReplayResult:  # type: ignore[no-untyped-def]
    """The decode loop's rounds on the reference: `propose(n, tokens_so_far)` gives the tree at anchor
    position n; returns per-round accepted counts (the engine's stop rules)."""
    seq = ref.sequence
    p = len(ref.prompt)
    generated = [seq[p]]
    result = ReplayResult(accepted=[], output=generated)
    stop = generated[-1] in eos or len(generated) >= max_new_tokens
    n = p
    while not stop:
        tree = propose(n)
        path, exhausted = walk(tree, seq, n + 1)
        result.ref_exhausted += int(exhausted)
        accepted = len(path) - 1
        committed = seq[n + 1: n + accepted + 2]  # accepted drafts + the bonus (the target's argmax)
        for t in committed:
            generated.append(t)
            if t in eos or len(generated) >= max_new_tokens:
                stop = True
                break
        result.accepted.append(accepted)
        n += accepted + 1
        if hasattr(propose, "observe"):
            propose.observe(tree, path, n)
    return result


class HeadProposals:
    """Fast proposals of a DFlash-family drafter over one reference (see the module docstring)."""

    def __init__(self, drafter: ParallelHeadDrafter, ref: Reference, top_k: int, chunk: int = 32) -> None:
        self.drafter, self.ref = drafter, ref
        target, head = drafter.target, drafter.head
        seq = torch.tensor([ref.sequence], device=target.device)
        length = seq.shape[1]
        feats = torch.cat([ref.hidden[t] for t in drafter.taps], dim=-1)  # [1, L, m*d]
        with torch.no_grad():
            self.ctx_kv = head.context_kv(feats, torch.arange(length, device=seq.device)[None], target.model)
        p = len(ref.prompt)
        anchors = list(range(p, p + ref.output_len))
        b = drafter.block_size
        k = min(top_k, target.config.vocab_size)
        self.top_k = k
        self.table: dict[int, tuple[Tensor, Tensor]] = {}
        offsets = torch.arange(b, device=seq.device)
        for s in range(0, len(anchors), chunk):
            group = torch.tensor(anchors[s: s + chunk], device=seq.device)  # [G]
            g = group.numel()
            tokens = seq[0, group][:, None].expand(g, b).reshape(1, -1)
            is_mask = (offsets > 0)[None].expand(g, b).reshape(1, -1)
            pos = (group[:, None] + offsets).reshape(1, -1)
            mask = uniform_blocks_mask(group[None], b, drafter.attention, length)
            with torch.no_grad():
                x = head.embed_block(tokens, is_mask, target.model)
                hidden = head(x, pos, self.ctx_kv, mask, target.model)[0].view(g, b, -1)[:, 1:]  # [G, D, d]
                logp = torch.log_softmax(head.logits(hidden, target.model.lm_head.weight).float(), dim=-1)
                vals, idx = logp.topk(k, dim=-1)  # [G, D, K]
            for a, v, i in zip(group.tolist(), vals, idx):
                self.table[a] = (v, i)

    def depth_logp(self, n: int) -> Tensor:
        """[D, V]: the top-K log-probs of pass 1 at anchor n, everything else FILL_LOGP."""
        vals, idx = self.table[n]
        dense = torch.full((vals.shape[0], self.drafter.target.config.vocab_size), FILL_LOGP, device=vals.device)
        return dense.scatter_(1, idx, vals)

    def path_logp(self, n: int, tree: DraftTree) -> Tensor:
        ctx = [(k[:, :, :n], v[:, :, :n]) for k, v in self.ctx_kv]
        is_mask = torch.zeros(tree.num_nodes, dtype=torch.bool, device=tree.device)
        with torch.no_grad():
            return head_logp(self.drafter.head, self.drafter.target, ctx, tree.tokens, is_mask, tree.depth,
                             tree.ancestor_mask)


def replay_head(drafter: ParallelHeadDrafter, ref: Reference, policy: TreePolicy, budget: int, max_new_tokens: int,
                proposals: HeadProposals | None = None) -> ReplayResult:
    """Replay a DFlash-family drafter through its fast path (pass `proposals` to share pass 1
    across policies and budgets; its top-K must be >= budget)."""
    needed = max(budget, getattr(drafter, "candidates", None) or 0)
    proposals = proposals or HeadProposals(drafter, ref, top_k=needed)
    if needed > proposals.top_k and proposals.top_k < drafter.target.config.vocab_size:
        raise ValueError(f"these proposals keep the top {proposals.top_k} tokens per depth; budget {needed} needs more")
    seq = ref.sequence

    def propose(n: int) -> DraftTree:
        scores = DepthScores(seq[n], proposals.depth_logp(n))
        if isinstance(drafter, JetSpecTreeDrafter):
            return drafter.tree_from_scores(scores, policy, budget, path_logp=lambda tree: proposals.path_logp(n, tree))
        return drafter.tree_from_scores(scores, policy, budget)

    return simulate(ref, max_new_tokens, set(drafter.target.eos_token_ids), propose)


def replay_self_chain(drafter: SelfDrafter, ref: Reference, budget: int, max_new_tokens: int) -> ReplayResult:
    """Replay the `self` drafter's greedy chain through one teacher-forced pass of its shallow model."""
    target, seq = drafter.target, ref.sequence
    length = len(seq)
    with torch.inference_mode():
        ids = torch.tensor([seq], device=target.device)
        out = target.forward(ids, torch.arange(length, device=target.device)[None],
                             target.new_cache(length, num_layers=drafter.layers), None, (),
                             num_layers=drafter.layers, kv_len=length)
        predicted = out.logits[0].argmax(-1).tolist()  # [L]: the shallow model's next token after each position

    def propose(n: int) -> DraftTree:
        chain: list[int] = []
        for pos in range(n, min(n + budget, length)):  # drafting along the reference while it matches
            chain.append(predicted[pos])
            if pos + 1 >= length or predicted[pos] != seq[pos + 1]:
                break
        return DraftTree.chain(seq[n], chain, device=target.device)

    return simulate(ref, max_new_tokens, set(target.eos_token_ids), propose)


class _GenericProposer:
    """Drives any drafter's begin/draft/observe on the reference."""

    def __init__(self, drafter: Drafter, ref: Reference, policy: TreePolicy, budget: int, max_seq_len: int) -> None:
        self.drafter, self.ref, self.policy, self.budget = drafter, ref, policy, budget
        target = drafter.target
        p = len(ref.prompt)
        self.state = DraftState(tokens=ref.sequence[: p + 1], prompt_len=p, sampling=SamplingConfig(),
                                draft_rng=TorchRandomness(0))
        empty = torch.empty(0, device=target.device)
        self.taps = tuple(drafter.taps)
        drafter.begin(self.state, ForwardOutput(logits=empty, hidden={t: ref.hidden[t][:, :p] for t in self.taps}),
                      max_seq_len)

    def __call__(self, n: int) -> DraftTree:
        assert self.state.cache_len == n
        tree = self.drafter.draft(self.state, self.policy, self.budget)
        if self.drafter.foresees:  # as the engine: after drafting, before the result is known
            self.drafter.foresee(self.state, tree)
        return tree

    def observe(self, tree: DraftTree, path: list[int], new_n: int) -> None:
        seq = self.ref.sequence
        n = self.state.cache_len
        hidden = {}
        for t in self.taps:
            rows = torch.full((1, tree.num_nodes, self.ref.hidden[t].shape[-1]), float("nan"),
                              dtype=self.ref.hidden[t].dtype, device=self.ref.hidden[t].device)
            rows[0, path] = self.ref.hidden[t][0, n: n + len(path)]  # accepted node at depth j = position n + j
            hidden[t] = rows
        result = VerifyResult(path=path, tokens=seq[n + 1: new_n + 1])
        self.drafter.observe(tree, result, ForwardOutput(logits=torch.empty(0), hidden=hidden))
        self.state.tokens.extend(result.tokens)


def replay_drafter(drafter: Drafter, ref: Reference, policy: TreePolicy, budget: int, max_new_tokens: int,
                   max_seq_len: int = 2048) -> ReplayResult:
    """Replay any drafter through its own draft()/observe() (the generic path)."""
    with torch.inference_mode():
        proposer = _GenericProposer(drafter, ref, policy, budget, max_seq_len)
        return simulate(ref, max_new_tokens, set(drafter.target.eos_token_ids), proposer)


def replay(drafter: Drafter, ref: Reference, policy: TreePolicy, budget: int, max_new_tokens: int,
           proposals: HeadProposals | None = None, max_seq_len: int = 2048) -> ReplayResult:
    """The fast paths for DFlash-family heads and the self drafter's chain, the generic path for
    everything else."""
    if isinstance(drafter, ParallelHeadDrafter):
        return replay_head(drafter, ref, policy, budget, max_new_tokens, proposals)
    if isinstance(drafter, SelfDrafter) and policy.name == "chain":
        return replay_self_chain(drafter, ref, budget, max_new_tokens)
    return replay_drafter(drafter, ref, policy, budget, max_new_tokens, max_seq_len)


__all__ = ["Reference", "ReplayResult", "HeadProposals", "build_references", "replay", "replay_drafter", "replay_head",
           "replay_self_chain", "simulate", "walk"]
