"""`SpecDecoder`: the decode loop. Plain AR decoding is the same loop with no drafter.

One round (docs/DESIGN.md), as stages, each a function of the previous one's output:
    draft / tree:    tree = the drafter's phases (node 0 = the anchor)           AR: the root alone
    verify_forward:  out = target.forward(tree.tokens, cache_len + tree.depth, cache, tree.ancestor_mask, taps)
    verify:          acc = verifier.accept(tree, out.logits)   the decision as device tensors
    commit:          cache.commit_packed(acc.path, acc.count); drafter.observe(tree, acc, out); anchor = bonus
    foresight:       drafter.foresee(state, tree) when the drafter foresees (JetSpec++'s host round): its
                     work for the next round, enqueued after the verify forward so it can run beside it;
                     a device drafter's side phase instead is a stage between verify and commit, replayed
                     on its own stream (forked after drafting, joined before the commit)
then one host read of (acc, the tree's tokens, a branching drafter's flag, a finiteness flag); a
branching drafter's next round's stages follow that flag (captured once per branch, no lookahead). With a verifier that draws through
the host's `Randomness` (T > 0) the verify and commit stages run on the host instead.

Exact replay (`generate(..., reference=TeacherForced)`, T = 0, the greedy verifier): the same loop, stop
rules and drafting stages, but no target forward: the "verify" stage is the greedy rule with the known
continuation's tokens as the target's picks, and the drafter observes the reference's teacher-forced
states at the accepted nodes. It measures tau on many prompts without running the target per round. A
device drafter's replay round is the device round with the verify forward's place taken by gathers from
the reference, held in static buffers (`_ReplayBuffers`): captured in CUDA graphs like a decoding round,
one host read per round; a host drafter's (or `replay_on_device=False`) walks the reference on the host.

On CUDA the stages after drafting replay CUDA graphs captured once, after an eager first round (so
graphed and eager rounds run the same code); a device drafter's phases are graphed too and the next
round is launched before this one is read (lookahead), so the host's bookkeeping overlaps the device's
work; a host drafter drafts on the host and its tree is copied into static buffers. Stage times come
from CUDA events (no device sync per stage). Decode time ends when the last needed round has been read
(a lookahead round launched past the stop is not waited for), for AR and speculative decoding alike.
"""

from __future__ import annotations

import hashlib
import time
import weakref
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Sequence

import torch
from torch import Tensor

from specbench.config import ConfigError, SamplingConfig, SpecConfig
from specbench.drafters import DRAFTERS
from specbench.drafters.base import Drafter, DraftState, TeacherForced
from specbench.models.decoder import ForwardOutput, KVCache
from specbench.models.graphs import Constant, GraphedForward, SideStage, Stage, StageGraphs
from specbench.models.target import TargetModel
from specbench.stats import RequestStats, RoundClock, RoundStats
from specbench.trees import TREE_POLICIES
from specbench.trees.base import DepthScores, DraftTree, TreePolicy
from specbench.trees.grow import ExpandFn
from specbench.verify import VERIFIERS
from specbench.verify.base import Acceptance, Randomness, TorchRandomness, Verifier, VerifyResult, read_acceptance
from specbench.verify.vectorised import accept_packed, walk_batched


class NonFiniteLogitsError(FloatingPointError):
    """The target produced NaN/inf logits."""


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    tokens: list[int]  # generated ids (EOS included when it stopped the request)
    stats: RequestStats
    config: dict[str, Any] = field(default_factory=dict)


class TimedPolicy(TreePolicy):
    """Wraps a policy so a host drafter's calls of `build`/`select`/`grow` are charged to the "tree" stage
    of the round clock (the drafter's `expand` passes inside `grow` stay in "draft"). Other attributes
    are forwarded to the wrapped policy."""

    can_grow = True  # it overrides grow; the instance reports the wrapped policy's own can_grow

    def __init__(self, inner: TreePolicy, clock: RoundClock) -> None:
        self.inner, self.clock = inner, clock
        self.name = inner.name
        self.can_grow = inner.can_grow  # type: ignore[misc]

    def _timed(self, fn: Callable[..., DraftTree], *args: Any) -> DraftTree:
        self.clock.switch("tree")
        try:
            return fn(*args)
        finally:
            self.clock.switch("draft")

    def build(self, scores: DepthScores, budget: int) -> DraftTree:
        return self._timed(self.inner.build, scores, budget)

    def select(self, candidates: DraftTree, budget: int) -> DraftTree:
        return self._timed(self.inner.select, candidates, budget)

    def capturable(self, device: torch.device) -> bool:
        return self.inner.capturable(device)

    def grow(self, anchor: int, expand: ExpandFn, budget: int, max_depth: int,
             device: torch.device | str = "cpu") -> DraftTree:
        def expand_as_draft(tree: DraftTree, frontier: torch.Tensor) -> torch.Tensor:
            self.clock.switch("draft")  # the drafter's passes stay in "draft"
            try:
                return expand(tree, frontier)
            finally:
                self.clock.switch("tree")

        return self._timed(self.inner.grow, anchor, expand_as_draft, budget, max_depth, device)

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)


def _derived_seed(seed: int, stream: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{stream}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


class _ReplayBuffers:
    """Exact replay's reference where a captured round reads it: the sequence's tokens (-1 past its end)
    and the teacher-forced states of the drafter's taps over `slots` positions, and the committed length
    (the anchor's position), all on the device; `load` puts a request's reference in."""

    def __init__(self, target: TargetModel, taps: Sequence[int], slots: int) -> None:
        device = target.device
        self.slots = slots
        self.tokens = torch.full((slots,), -1, dtype=torch.long, device=device)
        self.hidden = {t: torch.zeros(1, slots, target.config.hidden_size, dtype=target.dtype, device=device)
                       for t in taps}
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.no_logits = torch.empty(0, device=device)

    def load(self, reference: TeacherForced, position: int) -> None:
        n = len(reference.tokens)
        if n > self.slots:
            raise ConfigError(f"the reference has {n} tokens, more than the {self.slots} the decoder's replay buffers "
                              f"hold: raise max_seq_len", keys=("max_seq_len",))
        self.tokens.fill_(-1)
        self.tokens[:n].copy_(torch.tensor(reference.tokens, dtype=torch.long))
        for t, states in self.hidden.items():
            states[:, :n].copy_(reference.hidden[t][:, :n])
        self.position.fill_(position)

    def forward(self, tree: DraftTree) -> ForwardOutput:
        """The teacher-forced states at each node's position (an accepted node at depth j sits at n + j;
        the other rows are states of other positions, which a drafter reads only for accepted nodes)."""
        rows = (self.position + tree.depth).clamp_(max=self.slots - 1)  # [N]
        return ForwardOutput(logits=self.no_logits, hidden={t: h[:, rows] for t, h in self.hidden.items()})

    def picks(self, tree: DraftTree) -> Tensor:
        """The target's greedy pick after each node [N]: the reference's next token (-1 past its end, where
        the walk stops and the bonus is dropped)."""
        return self.tokens[(self.position + 1 + tree.depth).clamp_(max=self.slots - 1)]


@dataclass
class _Launched:
    """A round queued on the device and not read yet (or, with a host verifier, already decided)."""

    tree: DraftTree  # the verified tree (static buffers on the graphed path)
    size: int  # its draft nodes (a padded host tree: the real ones)
    readout: Tensor | None = None  # [2 + 2N + 1] int64: Acceptance.packed, the tree's tokens, the finite flag
    ready: Any = None  # CUDA event: the pinned copy of the readout has landed
    out: ForwardOutput | None = None  # the verify forward's output (static buffers on the graphed path)
    result: VerifyResult | None = None  # a host verifier's result


class SpecDecoder:
    """Speculative (or, with no drafter, plain autoregressive) decoding of one request at a time.

    The KV cache is allocated once for `max_seq_len` tokens (default: min(2048, the target's
    context)) plus room for one round past them, and reused across requests. cuda_graphs (default: on
    CUDA) replays the round's stages from CUDA graphs; lookahead (default: with graphs) launches a
    round before the previous one is read, when the drafter is device work (or there is none).
    capture_check: a context manager factory the stages that would be captured run inside, from the
    second round on, when they run eagerly (tests use one that fails on any host read).
    replay_on_device (default: on CUDA, with a device drafter): exact replay's rounds as device rounds
    (module docstring), whose drafter sees the request as decoding, without the reference; False walks
    the reference on the host, where drafters may draft from precomputed tables along it.
    """

    def __init__(
        self,
        target: TargetModel,
        spec: SpecConfig | None = None,
        *,
        max_seq_len: int | None = None,
        drafter: Drafter | None = None,
        policy: TreePolicy | None = None,
        verifier: Verifier | None = None,
        check_finite: bool = True,
        cuda_graphs: bool | None = None,
        lookahead: bool | None = None,
        capture_check: Callable[[], ContextManager[Any]] | None = None,
        replay_on_device: bool | None = None,
    ) -> None:
        self.target = target
        self.spec = spec or SpecConfig()
        context = target.config.max_position_embeddings
        max_seq_len = max_seq_len if max_seq_len is not None else min(2048, context)
        if max_seq_len > context:
            raise ConfigError(f"max_seq_len={max_seq_len} exceeds the target's context ({context})", keys=("max_seq_len",))
        self.max_seq_len = max_seq_len
        self.verifier = verifier or VERIFIERS.build(self.spec.verifier, **dict(self.spec.verifier_args))
        if not self.verifier.lossless and not self.spec.allow_lossy:
            raise ConfigError(f"verifier {self.spec.verifier!r} is not lossless; set allow_lossy=True to run it anyway",
                              keys=("allow_lossy",))
        self.policy = policy or TREE_POLICIES.build(self.spec.tree, **dict(self.spec.tree_args))
        if drafter is None and self.spec.drafter is not None:
            drafter = DRAFTERS.build(self.spec.drafter, target, **dict(self.spec.drafter_args))
        self.drafter = drafter
        if drafter is not None:
            drafter.check_policy(self.policy)
        is_cuda = target.device.type == "cuda"
        self.cuda_graphs = is_cuda and (cuda_graphs is None or bool(cuda_graphs))
        self.device_drafting = drafter is None or drafter.capturable(self.policy)
        # a branching drafter's next round depends on this round's readout: no lookahead
        self.branching = drafter is not None and self.device_drafting and drafter.branches
        self.lookahead = (self.cuda_graphs and self.device_drafting and not self.branching
                          and (lookahead is None or bool(lookahead)))
        self.check_finite = check_finite
        self.cache_slots = max_seq_len + 2 * (self.budget + 1)  # room for a lookahead round past the end
        self._cache: KVCache | None = None  # allocated on first use: exact replay never needs it
        self.anchor = torch.zeros(1, dtype=torch.long, device=target.device)  # the next tree's root
        self._root_tree = DraftTree.root_only(self.anchor, target.device)  # AR's tree: the anchor alone, static
        self.clock = RoundClock(is_cuda)
        self._timed_policy = TimedPolicy(self.policy, self.clock)
        if drafter is not None:
            drafter.cuda_graphs = self.cuda_graphs
        self._graphs: dict[str, StageGraphs] = {}  # per drafter branch: the round's stages after drafting (or all), captured
        self._warmed: set[str] = set()  # branches of which an eager round ran: their stages may be captured
        self._static_tree: DraftTree | None = None  # a host drafter's tree, padded into static buffers
        self._graphed_forward: GraphedForward | None = None  # the verify forward of host-verified rounds
        self._pinned: list[Tensor] = []
        self.capture_check = capture_check  # eager rounds run their capturable stages inside it (CPU tests)
        # exact replay as the device round (a device drafter's; by default on CUDA, where its rounds replay
        # graphs) or as the host walk of the reference (where drafters use their reference shortcuts)
        self.replay_on_device = drafter is not None and self.device_drafting and (
            is_cuda if replay_on_device is None else bool(replay_on_device))
        self._replay: _ReplayBuffers | None = None
        self._replaying = False  # this request is a replay on the device

    @property
    def cache(self) -> KVCache:
        """The target's KV cache (`cache_slots` slots, allocated once and reused across requests)."""
        if self._cache is None:
            self._cache = self.target.new_cache(self.cache_slots)
        return self._cache

    @property
    def captured(self) -> tuple[str, ...]:
        """The branches whose round is captured in CUDA graphs ("" for a drafter that does not branch)."""
        return tuple(self._graphs)

    @property
    def budget(self) -> int:
        return self.spec.budget if self.drafter is not None else 0

    def check_request(self, prompt_len: int, max_new_tokens: int) -> None:
        """Fail before any work if the request cannot fit the cache."""
        if prompt_len < 1:
            raise ConfigError("the prompt is empty: give at least one token")
        need = prompt_len + max_new_tokens + self.budget + 1
        if need > self.max_seq_len:
            raise ConfigError(
                f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) + budget + 1 = {need} exceeds "
                f"the {self.max_seq_len}-token context the cache was built for: shorten the prompt, lower "
                f"max_new_tokens, or raise max_seq_len (at most {self.target.config.max_position_embeddings})",
                keys=("max_new_tokens", "max_seq_len"))

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        *,
        rng: Randomness | None = None,
        draft_rng: Randomness | None = None,
        on_round: Callable[[int, DraftTree, VerifyResult], None] | None = None,
        reference: TeacherForced | None = None,
    ) -> GenerationResult:
        """Decode one request. Randomness comes from two independent streams seeded by
        `sampling.seed` (verification and drafting); tests may pass their own `rng`/`draft_rng`
        (e.g. an enumerator). `on_round(round_no, tree, result)` sees every verified tree.
        `reference`: exact replay of this prompt's known greedy continuation (module docstring)."""
        sampling = sampling or SamplingConfig()
        prompt = [int(t) for t in prompt_ids]
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}", keys=("max_new_tokens",))
        self.check_request(len(prompt), max_new_tokens)
        self.verifier.check(sampling)
        if reference is not None:
            self._check_reference(reference, prompt, sampling)
        vocab = self.target.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise ConfigError(f"prompt token ids must lie in [0, {vocab})")
        target = self.target
        device = target.device
        rng = rng or TorchRandomness(_derived_seed(sampling.seed, "verify"))
        draft_rng = draft_rng or TorchRandomness(_derived_seed(sampling.seed, "draft"))
        taps = self.drafter.taps if self.drafter is not None else ()
        eos = set(target.eos_token_ids)
        stats = RequestStats(prompt_tokens=len(prompt))
        cache = self.cache if reference is None else None  # exact replay runs no target forward
        if cache is not None:
            cache.reset()
        self.clock.begin_request()
        self._claim_drafter()
        self._side_spans: dict[int, tuple[Any, Any]] = {}  # round -> a side stage's own span (CUDA events)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

        # ---- prefill: the prompt, then the first token from its last row ----------------------
        t0 = time.perf_counter()
        if cache is not None:
            ids = torch.tensor([prompt], dtype=torch.long, device=device)
            pos = torch.arange(len(prompt), device=device)[None]
            out = target.forward(ids, pos, cache, None, taps, logits_rows="last", kv_len=len(prompt))
            self._raise_if_nonfinite(self.check_finite and not bool(all_finite(out.logits)), "prefill")
            cache.advance(len(prompt))
            first = self.verifier.verify(DraftTree.root_only(prompt[-1], device), out.logits[0], sampling, rng)
        else:  # the prompt's teacher-forced states and the reference's first token
            out = ForwardOutput(logits=torch.empty(0, device=device),
                                hidden={t: reference.hidden[t][:, : len(prompt)] for t in taps})
            first = VerifyResult(path=[0], tokens=[reference.tokens[len(prompt)]])
        self._replaying = reference is not None and self.replay_on_device
        if self._replaying:
            if self._replay is None:
                self._replay = _ReplayBuffers(target, taps, self.cache_slots + 2 * (self.budget + 1))
            self._replay.load(reference, len(prompt))  # type: ignore[arg-type]
        self.anchor.fill_(first.tokens[-1])
        tokens = prompt + first.tokens
        generated = list(first.tokens)
        state = DraftState(tokens=tokens, prompt_len=len(prompt), sampling=sampling, draft_rng=draft_rng,
                           want_draft_probs=self.verifier.needs_draft_probs and not sampling.greedy,
                           anchor_device=self.anchor, reference=None if self._replaying else reference)
        if self.drafter is not None and generated[-1] not in eos and max_new_tokens > 1:
            self.drafter.begin(state, out, self.cache_slots)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        stats.prefill_time = time.perf_counter() - t0
        stop = "eos" if generated[-1] in eos else ("length" if len(generated) >= max_new_tokens else "")

        # ---- rounds ----------------------------------------------------------------------------
        t1 = time.perf_counter()
        lookahead = (self.lookahead and on_round is None and reference is None
                     and self.verifier.accepts_on_device(sampling))
        launched = self._launch(state, sampling, rng) if not stop else None
        round_no = 0
        while launched is not None:
            round_no += 1
            following = self._launch(state, sampling, rng) if lookahead else None
            res = self._read(launched, round_no)
            self._observe_on_host(launched, res)
            if on_round is not None:
                on_round(round_no, _host_copy(launched.tree), res)
            emitted = []
            for t in res.tokens:
                emitted.append(t)
                if t in eos:
                    stop = "eos"
                    break
                if len(generated) + len(emitted) >= max_new_tokens:
                    stop = "length"
                    break
            tokens.extend(res.tokens)  # the whole verified block is committed (cache holds it)
            generated.extend(emitted)
            stats.rounds.append(RoundStats(accepted=len(res.path) - 1, tree_size=launched.size, emitted=len(emitted)))
            launched = None if stop else (following or self._launch(state, sampling, rng))
        stats.decode_time = time.perf_counter() - t1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            stats.peak_memory_bytes = int(torch.cuda.max_memory_allocated(device))
        for i, r in enumerate(stats.rounds):
            r.times = self.clock.times(i)
            if i in self._side_spans:
                start, end = self._side_spans[i]
                r.side_time = start.elapsed_time(end) / 1e3
        stats.new_tokens = len(generated)
        stats.stop_reason = stop
        return GenerationResult(prompt_ids=prompt, tokens=generated, stats=stats)

    def _claim_drafter(self) -> None:
        """Graphs captured with a drafter read its buffers where they were then; a request of another
        decoder with the same drafter may have reallocated them (a larger cache), so after one this
        decoder's graphs are dropped and captured again (an eager round first). Replay scripts build a
        drafter per decoder so that this stays rare."""
        if not self.cuda_graphs or self.drafter is None:
            return
        owner = getattr(self.drafter, "graphs_of", None)
        if owner is None or owner() is not self:
            self._graphs.clear()
            self._warmed.clear()
            self.drafter.graphs_of = weakref.ref(self)

    # ---- the round's stages --------------------------------------------------------------------
    def _drafting(self, state: DraftState, static: bool) -> list[Stage]:
        """The drafting stages; a host drafter's tree goes into static buffers when `static`."""
        if self.drafter is None:
            return [("draft", Constant(self._root_tree))]
        if self.device_drafting:
            return self.drafter.phases(state, self.policy, self.spec.budget)
        return [("draft", lambda _: self._host_draft(state, static))]

    def _host_draft(self, state: DraftState, static: bool) -> DraftTree:
        tree = self.drafter.draft(state, self._timed_policy, self.spec.budget)  # type: ignore[union-attr]
        if tree.budget > self.spec.budget:
            raise RuntimeError(f"drafter returned {tree.budget} draft nodes for budget {self.spec.budget}")
        if static:
            return self._into_static(tree)
        return tree if tree.device == self.target.device else _on_device(tree, self.target.device)

    def _into_static(self, tree: DraftTree) -> DraftTree:
        """A host drafter's tree copied into static buffers of 1 + budget nodes (what the graphed stages
        read); padding nodes are parentless, see only themselves and are never accepted."""
        n, size = tree.num_nodes, 1 + self.spec.budget
        if self._static_tree is None:
            z = torch.zeros(size, dtype=torch.long, device=self.target.device)
            self._static_tree = DraftTree(tokens=z.clone(), parents=z.clone(), depth=z.clone(), depth_bound=size - 1)
            self._static_tree.__dict__["ancestor_mask"] = torch.zeros(size, size, dtype=torch.bool, device=z.device)
            self._pinned_tree = (torch.zeros(3, size, dtype=torch.long).pin_memory(),
                                 torch.zeros(size, size, dtype=torch.bool).pin_memory())
        static = self._static_tree
        ints, mask = self._pinned_tree
        ints.zero_()
        ints[1] = -1
        ints[:, :n] = torch.stack([tree.tokens, tree.parents, tree.depth]).cpu()
        mask.copy_(torch.eye(size, dtype=torch.bool))
        mask[:n, :n] = tree.ancestor_mask.cpu()
        static.tokens.copy_(ints[0], non_blocking=True)
        static.parents.copy_(ints[1], non_blocking=True)
        static.depth.copy_(ints[2], non_blocking=True)
        static.ancestor_mask.copy_(mask, non_blocking=True)
        static.meta["host"] = tree
        return static

    def _verify_forward(self, tree: DraftTree, state: DraftState) -> tuple[DraftTree, ForwardOutput]:
        taps = self.drafter.taps if self.drafter is not None else ()
        # off the CPU the whole cache (one shape: capturable, and eager rounds compute exactly what the
        # graphed ones do); on the CPU only the filled slots
        kv_len = None if tree.device.type != "cpu" else state.cache_len + tree.num_nodes
        out = self.target.forward(tree.tokens[None], (self.cache.lengths + tree.depth)[None], self.cache,
                                  tree.ancestor_mask[None], taps, kv_len=kv_len)
        return tree, out

    def _commit(self, tree: DraftTree, out: ForwardOutput, acc: Acceptance) -> tuple[Tensor, DraftTree, ForwardOutput]:
        """Commit on the device; returns the round's readout [2 + 2N (+ 1) + 1]: the Acceptance, the
        tree's tokens, a branching drafter's flag, the finite flag (and the tree and the forward's
        output, for the host). In a replay round the reference's position moves on instead of the
        cache, and past the reference's end the walk has no bonus (-1): the anchor stays a valid id."""
        # 1 = every logit finite (the cat promotes the flag to int64); a replay round has no logits
        check = self.check_finite and not self._replaying
        finite = all_finite(out.logits).view(1) if check else acc.count.new_ones(1)
        parts = [acc.packed, tree.tokens]  # the tokens before the anchor (AR's tree token) moves on
        bonus = acc.bonus
        if self._replaying:
            assert self._replay is not None
            self._replay.position.add_(acc.count)
            bonus = bonus.clamp(min=0)
        else:
            self.cache.commit_packed(acc.path, acc.count)
        if self.drafter is not None and self.device_drafting:
            self.drafter.observe(tree, acc, out)
            if self.branching:
                parts.append(self.drafter.branch_flag())
        self.anchor.copy_(bonus)
        return torch.cat([*parts, finite]), tree, out

    def _device_stages(self, state: DraftState, sampling: SamplingConfig) -> tuple[list[Stage], list[Stage]]:
        """(eager prefix, capturable rest) of a round decided on the device; in exact replay the verify
        forward and accept read the reference's buffers instead."""
        verifier, replay = self.verifier, self._replay
        if not self._replaying:
            rest: list[Stage] = [
                ("verify_forward", lambda tree: self._verify_forward(tree, state)),
                ("verify", lambda x: (*x, verifier.accept(x[0], x[1].logits[0], sampling))),
                ("commit", lambda x: self._commit(*x)),
            ]
        else:
            assert replay is not None
            rest = [
                ("verify_forward", lambda tree: (tree, replay.forward(tree))),
                ("verify", lambda x: (*x, Acceptance(accept_packed(x[0], replay.picks(x[0]))))),
                ("commit", lambda x: self._commit(*x)),
            ]
        side = self._side_phase(state)
        if side is not None:  # beside the verify forward, reading the tree only (x[0]), before the commit
            name, step = side
            rest.insert(2, (name, lambda x: (step(x[0]), x)[1]))
        drafting = self._drafting(state, static=self.cuda_graphs)
        return ([], drafting + rest) if self.device_drafting else (drafting, rest)

    def _side_phase(self, state: DraftState) -> Stage | None:
        if self.drafter is None or not self.device_drafting:
            return None
        return self.drafter.side_phase(state, self.policy, self.spec.budget)

    def _side_stage(self, stages: list[Stage]) -> SideStage | None:
        """Where a device drafter's side phase (the stage between verify and commit) replays: on its
        own stream, forked after drafting, joined before the commit. None: no side phase or stream."""
        stream = self.drafter.side_stream if self.drafter is not None and self.device_drafting else None
        names = [name for name, _ in stages]
        side = names[names.index("verify") + 1]
        if stream is None or side == "commit":
            return None
        return SideStage(name=side, fork="verify_forward", join="commit", stream=stream)

    def _run_eagerly(self, stages: list[Stage], x: Any = None) -> Any:
        """The stages in order, each charged to its stage name; returns the last one's output."""
        for name, step in stages:
            self.clock.switch(name)
            x = step(x)
        return x

    def _launch(self, state: DraftState, sampling: SamplingConfig, rng: Randomness) -> _Launched:
        """Queue one round: graph replays (or the same stages run eagerly) and the async copy of the
        readout; a host verifier's round is decided here."""
        clock = self.clock
        clock.start_round()
        if state.reference is not None:
            return self._launch_reference(state)
        if not self.verifier.accepts_on_device(sampling):
            return self._launch_host_verified(state, sampling, rng)
        branch = self.drafter.branch if self.branching else ""  # type: ignore[union-attr]
        if self._replaying:
            branch = "replay:" + branch  # its own graphs: the stages after drafting differ
        prefix, rest = self._device_stages(state, sampling)
        x = self._run_eagerly(prefix)
        warmed = branch in self._warmed
        if self.cuda_graphs and branch not in self._graphs and warmed:
            self._graphs[branch] = StageGraphs(rest, x, side=self._side_stage(rest))
        graphs = self._graphs.get(branch)
        if graphs is not None:
            readout, tree, out = graphs.replay(clock.switch)
            if graphs.side is not None and graphs.side.span is not None:
                self._side_spans[len(clock.rounds) - 1] = graphs.side.span
        else:
            check = self.capture_check if warmed and self.capture_check is not None else nullcontext
            with check():
                readout, tree, out = self._run_eagerly(rest, x)
            self._warmed.add(branch)
        self._foresee(state, tree)
        clock.close()
        size = tree.meta["host"].budget if "host" in tree.meta else tree.budget
        launched = _Launched(tree=tree, size=size, readout=readout, out=out)
        if readout.is_cuda:
            slot = len(self.clock.rounds) % 2
            while len(self._pinned) <= slot:
                self._pinned.append(torch.empty(0, dtype=readout.dtype).pin_memory())
            if self._pinned[slot].shape != readout.shape:
                self._pinned[slot] = torch.empty(readout.shape, dtype=readout.dtype).pin_memory()
            host = self._pinned[slot]
            host.copy_(readout, non_blocking=True)
            launched.readout, launched.ready = host, torch.cuda.Event()
            launched.ready.record()
        return launched

    def _launch_host_verified(self, state: DraftState, sampling: SamplingConfig, rng: Randomness) -> _Launched:
        """A round whose verifier draws through the host's randomness: drafting and the verify forward
        as usual (the forward from a CUDA graph on CUDA), then verify and commit on the host."""
        clock = self.clock
        tree = self._run_eagerly(self._drafting(state, static=False))
        clock.switch("verify_forward")
        if self.cuda_graphs:
            if self._graphed_forward is None:
                taps = self.drafter.taps if self.drafter is not None else ()
                self._graphed_forward = GraphedForward(self.target.model, self.cache, buckets=[1 + self.budget], taps=taps)
            out = self._graphed_forward(tree.tokens[None], (self.cache.lengths + tree.depth)[None], tree.ancestor_mask[None])
        else:
            tree, out = self._verify_forward(tree, state)
        self._foresee(state, tree)
        clock.switch("verify")
        self._raise_if_nonfinite(self.check_finite and not bool(all_finite(out.logits)), f"round {len(clock.rounds)}")
        res = self.verifier.verify(tree, out.logits[0], sampling, rng)
        clock.switch("commit")
        self.cache.commit(res.path)
        if self.drafter is not None:
            self.drafter.observe(tree, res, out)
        self.anchor.fill_(res.tokens[-1])
        clock.close()
        return _Launched(tree=tree, size=tree.budget, result=res)

    def _check_reference(self, reference: TeacherForced, prompt: list[int], sampling: SamplingConfig) -> None:
        if not sampling.greedy or type(self.verifier) is not VERIFIERS.get("greedy"):
            raise ConfigError("exact replay (reference=) follows the greedy continuation: it needs temperature 0 "
                              "and verifier=greedy", keys=("temperature", "verifier"))
        if reference.tokens[: len(prompt)] != prompt or len(reference.tokens) <= len(prompt):
            raise ConfigError("the reference must be the prompt followed by at least one token of its continuation")

    def _launch_reference(self, state: DraftState) -> _Launched:
        """Exact replay's round: the drafting stages as in decoding; then, instead of the verify forward,
        the greedy rule with the reference's tokens as the target's picks; the drafter observes the
        reference's teacher-forced states at the accepted nodes."""
        clock = self.clock
        tree = self._run_eagerly(self._drafting(state, static=False))
        self._foresee(state, tree)
        clock.switch("verify")
        res, out = _follow_reference(tree, state.reference, state.cache_len,  # type: ignore[arg-type]
                                     self.drafter.taps if self.drafter is not None else ())
        clock.switch("commit")
        if self.drafter is not None:
            self.drafter.observe(tree.meta.get("host", tree), res, out)
        self.anchor.fill_(res.tokens[-1])
        clock.close()
        return _Launched(tree=tree, size=tree.budget, result=res)

    def _foresee(self, state: DraftState, tree: DraftTree) -> None:
        """A foreseeing drafter's work for the next round, started once this round's verify forward is
        enqueued (so on CUDA it runs beside it), charged to the "foresight" stage (the host time it
        takes to launch; on the CPU it runs there and then)."""
        if self.drafter is not None and self.drafter.foresees:
            self.clock.switch("foresight")
            self.drafter.foresee(state, tree.meta.get("host", tree))

    def _read(self, launched: _Launched, round_no: int) -> VerifyResult:
        """The round's one host read (waits for its readout)."""
        if launched.result is not None:
            return launched.result
        assert launched.readout is not None
        if launched.ready is not None:
            launched.ready.synchronize()
        values = launched.readout.tolist()
        self._raise_if_nonfinite(not values[-1], f"round {round_no}")
        values = values[:-1]
        if self.branching:
            self.drafter.read_branch(values.pop())  # type: ignore[union-attr]
        res = read_acceptance(values, launched.tree.num_nodes)
        if res.tokens[-1] < 0:  # a replay walk that reached the reference's end: no bonus
            res.tokens.pop()
        return res

    def _observe_on_host(self, launched: _Launched, res: VerifyResult) -> None:
        """A host drafter sees the verified result after the read (a device drafter saw it in the commit
        stage; a host-verified round was observed in the round itself)."""
        if self.drafter is None or launched.result is not None or self.device_drafting:
            return
        assert launched.out is not None
        self.drafter.observe(launched.tree.meta.get("host", launched.tree), res, launched.out)

    def _raise_if_nonfinite(self, bad: bool, where: str) -> None:
        if bad:
            raise NonFiniteLogitsError(
                f"the target produced NaN/inf logits in the {where} forward: check the weights and dtype "
                f"(bf16/fp16 overflow?), or load the target in float32")


def all_finite(logits: Tensor) -> Tensor:
    """0-d bool on the logits' device: no NaN or inf among them. One fp32 sum instead of isfinite + all (a
    bool tensor the size of the logits and a second reduction: ~13 us a round on the H200 at 65 x 49k): NaN and
    inf propagate through the sum; a sum of finite logits that overflows fp32 (|logits| ~ 1e31) reads as
    non-finite too, which raises rather than hides."""
    return torch.isfinite(logits.sum(dtype=torch.float32))


def _follow_reference(tree: DraftTree, reference: TeacherForced, n: int,
                      taps: Sequence[int]) -> tuple[VerifyResult, ForwardOutput]:
    """The greedy walk of `tree` (anchor at position n) with the reference's token after each node as the
    target's pick (none past its end: the walk stops there, without a bonus), and the teacher-forced
    states of the accepted nodes (the other rows NaN: a drafter may read only those)."""
    ids = reference.tokens
    end = len(ids)
    picks = [ids[p] if p < end else -1 for p in (n + 1 + tree.depth.cpu()).tolist()]  # [N]
    res = walk_batched(tree, torch.tensor(picks, device=tree.device))
    if res.tokens[-1] < 0:
        res.tokens.pop()
    hidden = {}
    for t in taps:
        states = reference.hidden[t]  # [1, L, d]
        rows = states.new_full((1, tree.num_nodes, states.shape[-1]), float("nan"))
        rows[0, res.path] = states[0, n: n + len(res.path)]  # the accepted node at depth j sits at position n + j
        hidden[t] = rows
    return res, ForwardOutput(logits=torch.empty(0, device=tree.device), hidden=hidden)


def _on_device(tree: DraftTree, device: torch.device) -> DraftTree:
    moved = DraftTree(tokens=tree.tokens.to(device), parents=tree.parents.to(device), depth=tree.depth.to(device),
                      draft_probs=None if tree.draft_probs is None else tree.draft_probs.to(device),
                      scores=tree.scores, depth_bound=tree.depth_bound)
    moved.meta["host"] = tree
    return moved


def _host_copy(tree: DraftTree) -> DraftTree:
    """A tree of its own (a graphed round's tree lives in buffers the next round overwrites)."""
    tree = tree.meta.get("host", tree)
    return DraftTree(tokens=tree.tokens.clone(), parents=tree.parents.clone(), depth=tree.depth.clone(),
                     draft_probs=tree.draft_probs, scores=None if tree.scores is None else tree.scores.clone(),
                     depth_bound=tree.depth_bound)


def ar_decoder(target: TargetModel, max_seq_len: int | None = None, verifier: str = "greedy") -> SpecDecoder:
    """The fair baseline: the same loop, model code and cache, with no drafter."""
    return SpecDecoder(target, SpecConfig(drafter=None, verifier=verifier), max_seq_len=max_seq_len)


@torch.no_grad()
def generate_batch(target: TargetModel, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                   temperature: float = 0.0, generator: torch.Generator | None = None,
                   stop_at_eos: bool = True) -> list[list[int]]:
    """Responses to `prompts` (greedy at temperature 0, else sampled), each cut after its first EOS
    (stop_at_eos=False: always max_new_tokens tokens, the model continuing past EOS).

    Batched AR decoding for data regeneration and replay references (not a timed baseline: speed-ups
    are measured against `SpecDecoder` with no drafter). Prompts are right-padded and prefilled
    together, each row's cache length is then set to its own prompt length, and every step appends
    one token per row (rows at different lengths)."""
    model, dev = target.model, target.device
    b = len(prompts)
    lens = [len(p) for p in prompts]
    width = max(lens)
    cache = target.new_cache(width + max_new_tokens, batch=b)
    ids = torch.zeros(b, width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(list(p), dtype=torch.long)
    ids = ids.to(dev)
    pos = torch.arange(width, device=dev)[None].expand(b, width)
    last = model.config.num_layers - 1
    out = model(ids, pos, cache, None, taps=(last,), logits_rows="last", kv_len=width)
    rows = torch.arange(b, device=dev)
    h = out.hidden[last][rows, torch.tensor(lens, device=dev) - 1]  # [B, d]: each row's last prompt token
    logits = model.lm_head(model.norm(h))  # [B, V]
    for i, n in enumerate(lens):
        cache.truncate(n, row=i)
    eos = torch.tensor(sorted(target.eos_token_ids) or [-1], device=dev)
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    steps: list[torch.Tensor] = []
    kv_len = width
    for step in range(max_new_tokens):
        if temperature > 0:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)[:, 0]
        else:
            nxt = logits.argmax(dim=-1)
        steps.append(nxt)
        if stop_at_eos:
            done |= torch.isin(nxt, eos)
        if step == max_new_tokens - 1 or bool(done.all()):
            break
        out = model(nxt[:, None], cache.lengths[:, None], cache, None, logits_rows=None, kv_len=kv_len + 1)
        cache.advance_all(1)
        kv_len += 1
        logits = out.logits[:, 0]
    table = torch.stack(steps, dim=1).tolist()  # [B, steps]
    eos_set = set(target.eos_token_ids) if stop_at_eos else set()
    responses = []
    for row in table:
        cut = next((i + 1 for i, t in enumerate(row) if t in eos_set), len(row))
        responses.append(row[:cut])
    return responses
