"""`SpecDecoder`: the decode loop. Plain AR decoding is the same loop with no drafter.

One round (docs/DESIGN.md):
    tree = drafter.draft(state, policy, budget)                 # node 0 = anchor
    out  = target.forward(tree.tokens, cache_len + tree.depth, cache, tree.ancestor_mask, taps)
    res  = verifier.verify(tree, out.logits, sampling, rng)      # lossless rule
    cache.commit(res.path); drafter.observe(tree, res, out)
    tokens += res.tokens                                          # accepted drafts + bonus
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from specbench.config import ConfigError, SamplingConfig, SpecConfig
from specbench.drafters import DRAFTERS
from specbench.drafters.base import Drafter, DraftState
from specbench.models.target import TargetModel
from specbench.stats import RequestStats, RoundStats, StageTimer
from specbench.trees import TREE_POLICIES
from specbench.trees.base import DepthScores, DraftTree, TreePolicy
from specbench.trees.grow import ExpandFn
from specbench.verify import VERIFIERS
from specbench.verify.base import Randomness, TorchRandomness, Verifier, VerifyResult


class NonFiniteLogitsError(FloatingPointError):
    """The target produced NaN/inf logits."""


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    tokens: list[int]  # generated ids (EOS included when it stopped the request)
    stats: RequestStats
    config: dict[str, Any] = field(default_factory=dict)


class TimedPolicy(TreePolicy):
    """Wraps a policy so the engine can charge `build`/`select`/`grow` to the "tree" stage (the drafter's
    `expand` passes inside `grow` stay in "draft"). Other attributes are forwarded to the wrapped policy."""

    can_grow = True  # it overrides grow; the instance reports the wrapped policy's own can_grow

    def __init__(self, inner: TreePolicy, timer: StageTimer) -> None:
        self.inner, self.timer = inner, timer
        self.name = inner.name
        self.can_grow = inner.can_grow  # type: ignore[misc]

    def build(self, scores: DepthScores, budget: int) -> DraftTree:
        with self.timer.stage("tree"):
            return self.inner.build(scores, budget)

    def select(self, candidates: DraftTree, budget: int) -> DraftTree:
        with self.timer.stage("tree"):
            return self.inner.select(candidates, budget)

    def grow(self, anchor: int, expand: ExpandFn, budget: int, max_depth: int,
             device: torch.device | str = "cpu") -> DraftTree:
        def untimed(tree: DraftTree, frontier: torch.Tensor) -> torch.Tensor:
            with self.timer.excluded("tree"):
                return expand(tree, frontier)

        with self.timer.stage("tree"):
            return self.inner.grow(anchor, untimed, budget, max_depth, device)

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)


def _derived_seed(seed: int, stream: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{stream}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


class SpecDecoder:
    """Speculative (or, with no drafter, plain autoregressive) decoding of one request at a time.

    The KV cache is allocated once for `max_seq_len` tokens (default: min(2048, the target's
    context)) and reused across requests.
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
        sync_stages: bool | None = None,
        check_finite: bool = True,
        cuda_graphs: bool | None = None,
    ) -> None:
        self.target = target
        self.spec = spec or SpecConfig()
        context = target.config.max_position_embeddings
        max_seq_len = max_seq_len if max_seq_len is not None else min(2048, context)
        if max_seq_len > context:
            raise ConfigError(
                f"max_seq_len {max_seq_len} exceeds the target's context ({target.config.max_position_embeddings})")
        self.max_seq_len = max_seq_len
        self.verifier = verifier or VERIFIERS.build(self.spec.verifier, **dict(self.spec.verifier_args))
        if not self.verifier.lossless and not self.spec.allow_lossy:
            raise ConfigError(
                f"verifier {self.spec.verifier!r} is not lossless; set allow_lossy=True to run it anyway")
        self.policy = policy or TREE_POLICIES.build(self.spec.tree, **dict(self.spec.tree_args))
        if drafter is None and self.spec.drafter is not None:
            drafter = DRAFTERS.build(self.spec.drafter, target, **dict(self.spec.drafter_args))
        self.drafter = drafter
        if drafter is not None and not drafter.works_with(self.policy):
            raise ConfigError(
                f"drafter {self.spec.drafter!r} works with tree policies {drafter.policy_names()}, not {self.policy.name!r}")
        self.cache = target.new_cache(max_seq_len)
        is_cuda = target.device.type == "cuda"
        self.timer = StageTimer(torch.cuda.synchronize if (is_cuda if sync_stages is None else sync_stages) else None)
        self.check_finite = check_finite
        self._timed_policy = TimedPolicy(self.policy, self.timer)
        # Verify forwards replay CUDA graphs on the GPU (trees padded to 1 + budget nodes).
        self._graphed = None
        if is_cuda if cuda_graphs is None else cuda_graphs:
            from specbench.models.graphs import GraphedForward

            taps = drafter.taps if drafter is not None else ()
            self._graphed = GraphedForward(target.model, self.cache, buckets=[1 + self.budget], taps=taps)

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
                f"max_new_tokens, or raise max_seq_len (at most {self.target.config.max_position_embeddings})")

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
    ) -> GenerationResult:
        """Decode one request. Randomness comes from two independent streams seeded by
        `sampling.seed` (verification and drafting); tests may pass their own `rng`/`draft_rng`
        (e.g. an enumerator). `on_round(round_no, tree, result)` sees every verified tree."""
        sampling = sampling or SamplingConfig()
        prompt = [int(t) for t in prompt_ids]
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.check_request(len(prompt), max_new_tokens)
        self.verifier.check(sampling)
        vocab = self.target.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise ConfigError(f"prompt token ids must lie in [0, {vocab})")
        target, cache, timer = self.target, self.cache, self.timer
        device = target.device
        rng = rng or TorchRandomness(_derived_seed(sampling.seed, "verify"))
        draft_rng = draft_rng or TorchRandomness(_derived_seed(sampling.seed, "draft"))
        taps = self.drafter.taps if self.drafter is not None else ()
        eos = set(target.eos_token_ids)
        stats = RequestStats(prompt_tokens=len(prompt))
        cache.reset()
        timer.pop()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

        # ---- prefill: the prompt, then the first token from its last row ----------------------
        t0 = time.perf_counter()
        ids = torch.tensor([prompt], dtype=torch.long, device=device)
        pos = torch.arange(len(prompt), device=device)[None]
        out = target.forward(ids, pos, cache, None, taps, logits_rows="last", kv_len=len(prompt))
        self._check_finite(out.logits, "prefill")
        cache.advance(len(prompt))
        first = self.verifier.verify(DraftTree.root_only(prompt[-1], device), out.logits[0], sampling, rng)
        tokens = prompt + first.tokens
        generated = list(first.tokens)
        state = DraftState(tokens=tokens, prompt_len=len(prompt), sampling=sampling, draft_rng=draft_rng,
                           want_draft_probs=self.verifier.needs_draft_probs and not sampling.greedy)
        if self.drafter is not None and generated[-1] not in eos and max_new_tokens > 1:
            self.drafter.begin(state, out, self.max_seq_len)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        stats.prefill_time = time.perf_counter() - t0
        stop = "eos" if generated[-1] in eos else ("length" if len(generated) >= max_new_tokens else "")

        # ---- rounds ----------------------------------------------------------------------------
        t1 = time.perf_counter()
        round_no = 0
        while not stop:
            round_no += 1
            with timer.stage("draft"):
                if self.drafter is None:
                    tree = DraftTree.root_only(state.anchor, device)
                else:
                    tree = self.drafter.draft(state, self._timed_policy, self.spec.budget)
                    if tree.budget > self.spec.budget:
                        raise RuntimeError(f"drafter returned {tree.budget} draft nodes for budget {self.spec.budget}")
            n = tree.num_nodes
            with timer.stage("verify_forward"):
                positions = (state.cache_len + tree.depth)[None]
                if self._graphed is not None:
                    out = self._graphed(tree.tokens[None], positions, tree.ancestor_mask[None])
                else:
                    out = target.forward(tree.tokens[None], positions, cache, tree.ancestor_mask[None], taps,
                                         kv_len=state.cache_len + n)
                self._check_finite(out.logits, f"round {round_no}")
            with timer.stage("verify"):
                res = self.verifier.verify(tree, out.logits[0], sampling, rng)
            if on_round is not None:
                on_round(round_no, tree, res)
            with timer.stage("commit"):
                cache.commit(res.path)
                if self.drafter is not None:
                    self.drafter.observe(tree, res, out)
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
            stats.rounds.append(RoundStats(accepted=len(res.path) - 1, tree_size=n - 1, emitted=len(emitted),
                                           times=timer.pop()))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            stats.peak_memory_bytes = int(torch.cuda.max_memory_allocated(device))
        stats.decode_time = time.perf_counter() - t1
        stats.new_tokens = len(generated)
        stats.stop_reason = stop
        return GenerationResult(prompt_ids=prompt, tokens=generated, stats=stats)

    def _check_finite(self, logits: torch.Tensor, where: str) -> None:
        if self.check_finite and not bool(torch.isfinite(logits).all()):
            raise NonFiniteLogitsError(
                f"the target produced NaN/inf logits in the {where} forward: check the weights and dtype "
                f"(bf16/fp16 overflow?), or load the target in float32")


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
        cache.lengths += 1
        cache.host_lengths = [n + 1 for n in cache.host_lengths]
        kv_len += 1
        logits = out.logits[:, 0]
    table = torch.stack(steps, dim=1).tolist()  # [B, steps]
    eos_set = set(target.eos_token_ids) if stop_at_eos else set()
    responses = []
    for row in table:
        cut = next((i + 1 for i, t in enumerate(row) if t in eos_set), len(row))
        responses.append(row[:cut])
    return responses
