"""`jetspec++`: a block-causal parallel draft head with intra-block self-refinement (methods.md §5.1
items 2, 4-7; the round of §5.2 without foresight, which is part 2).

One round:
    J0:   [anchor, MASK x D] -> per-depth log-probs; drafts = their top-1 tokens
    for j in 1..J:
        if j <= R:  context refresh: the state adapter predicts the top tapped layer's states of
                    [anchor, drafts], the training-free decoder reads them -> p̂(.|i) per row;
                    k̂ = agreement length of the decoder's top-1 with the drafts; with `replace`
                    (anchor replacement) the decoder's token is written at depth k̂+1
        Jj:   [anchor, drafts] as token inputs (no MASK), block-causal -> per-depth log-probs;
              drafts = their top-1 tokens
    tree = policy.build(per-depth log-probs of the last pass)

What the tree is built from: the last pass's per-depth distributions, exactly as `jetspec` builds from
its single pass. Row d of the last pass is the head's law at depth d given the previous pass's tokens
up to d, so the rank-1 chain is the refined chain, and the other candidates at depth d share that row
whatever their parent (as in JetSpec, methods.md §4.2). The J0 scores are not mixed in: after
refinement they condition on nothing the last pass does not.

Without anchor replacement a refresh changes no draft token: it only re-predicts states, which the
foresight draft of part 2 reads (so J=j, R=r without replacement drafts exactly what J=j, R=0
drafts; a test checks it). `states` picks what the refresh's decoder reads (the Table 6 ablation):
`predicted` (the adapter), `stale` (the last verified state copied into every block position), `true`
(the target's own states of the block, from a forward of the target over the block against its own
copy of the committed prefix: an oracle for the ablation, costing a target pass).

Sampling: when the verifier reads draft probabilities (rejection sampling at T > 0) the refinement
passes still read top-1 tokens, and only the final tokens are drawn, each depth independently from
the last pass's processed law; those laws are recorded as the tree's draft_probs. Given the earlier
passes (fixed before any final draw) the depth-d token is independent of the other depths, so its
law given the drafted prefix is exactly the recorded row, which is what chain rejection sampling
needs. That needs the `chain` policy.

Foresight (part 2, `speculation.py`): with `foresight=on` the drafter drafts the next block for the B
most likely verification outcomes while the block is verified (the engine's `foresee` hook, a second
CUDA stream), keeps them in a speculation cache and, when the verified outcome is among them, takes
that block as the next tree without drafting on the critical path.

The device round (`capturable`: foresight off, the draft model on the target's device, a capturable
policy, T = 0): every step after `begin` is tensor ops of static shape with no host read, so the GPU
round captures the drafter's phases ("draft": J0, refreshes, J passes; "tree": policy.build) and its
`observe` in CUDA graphs. The anchor is the engine's device buffer; `observe` writes the draft cache,
the adapter's context cache of the top tap, the decoder's upper-layer K/V (and the stale buffer or
the oracle's cache) from the `Acceptance` rows padded to max_path, every length on the device
(`device_states.DeviceStates`). With foresight=on (predicted states, decoder scores, no record, T = 0)
the device round runs foresight too (`device_foresight.py`): a "foresight" stage beside the verify
forward (the engine's side phase, on the pipeline's second stream) fills a speculation cache of B
candidate trees in device buffers, `observe` looks the verified outcome up, and the hit flag rides the
round's readout; the next round's stages are then "hit" (the cached tree copied into the served
buffers) or "miss" (the draft stages above): the engine captures each branch once and, reading every
round before the next, runs no lookahead. Other foresight settings, another draft device, a policy
not capturable here, or host=true run the host round (the reference): committed states queued and
synced into host-sized caches before each read.

drafter_args: checkpoint (a jetspec++ directory, or a plain jetspec head: refinement without an
adapter, JetSpec++ Table 12), block_size, J (refinement passes, default 1), R (context refreshes,
0..J, default 1), replace (anchor replacement, default true), states (predicted | stale | true);
foresight (off | on | score: select and record but draft nothing ahead), B (outcomes drafted ahead,
default 16), select (top | threshold | ssd), scores (decoder | draft: whose rows rank outcomes), lam
(the threshold rule's λ), calibration (a per-depth temperature file from scripts/foresight_hits.py,
calibration.json; calibration_ngram.json adds the context n-gram expert of `ngram.py`; none =
uncalibrated), fanout_ratio (ssd), draft_device (default: the target's), draft_copy (true: the
two-device path even where draft_device is the target's: the draft model's own copy of the target's
weights, explicit transfers, the host round; issue 17's path run on one device), pipeline (auto |
sequential | concurrent), record (keep a `RoundRecord` per round for the offline evaluator); host
(true: the host round even where the device round could run).
"""

from __future__ import annotations


import torch
from torch import Tensor

from specbench.config import SamplingConfig
from specbench.drafters import DRAFTERS
from specbench.drafters.base import DraftState, Phase, Weights
from specbench.drafters.heads.backbone import DraftHead
from specbench.drafters.heads.drafter import BlockPlan, HeadDrafter, random_head
from specbench.drafters.heads.masks import block_pattern
from specbench.drafters.jetspecpp.adapter import AdapterConfig, ContextCache, StateAdapter
from specbench.drafters.jetspecpp.calibration import RowTemperature
from specbench.drafters.jetspecpp.decoder import SliceDecoder
from specbench.drafters.jetspecpp.device_foresight import DeviceForesight
from specbench.drafters.jetspecpp.device_states import DeviceStates
from specbench.drafters.jetspecpp.foresight import top1
from specbench.drafters.jetspecpp.model import NAME, load_jetspecpp
from specbench.drafters.jetspecpp.outcomes import outcome_distribution
from specbench.drafters.jetspecpp.pipeline import Pipeline, resolve_device, target_copy
from specbench.drafters.jetspecpp.selection import RULES
from specbench.drafters.jetspecpp.speculation import MODES, SCORES, Foresight
from specbench.models.decoder import ForwardOutput, KVCache
from specbench.models.target import TargetModel
from specbench.trees.base import DepthScores, DraftTree, TreePolicy
from specbench.verify.base import Acceptance, VerifyResult
from specbench.verify.sampling import process_logits

STATES = ("predicted", "stale", "true")


@DRAFTERS.register(NAME)
class JetSpecPPDrafter(HeadDrafter):
    """Built as `JetSpecPPDrafter(target, checkpoint=DIR | head=DraftHead, adapter=StateAdapter, J=, R=,
    replace=, states=)`. The head's own attention pattern is used (block-causal; a bidirectional
    head runs for the Table 15 ablation)."""

    name = NAME
    attention = "block-causal"
    # foresight drafts the next blocks from every tap's predicted states: the one use of the lower taps'
    # adapter modules, so GPTQ calibration (Weights.calibrate) drafts with it on
    weights = Weights(train="specbench train --drafter {drafter} --data DATA_DIR --out DIR", calibrate={"foresight": "on"})

    def __init__(self, target: TargetModel, checkpoint: str | None = None, head: DraftHead | None = None,
                 adapter: StateAdapter | None = None, block_size: int | None = None, J: int = 1, R: int = 1,
                 replace: bool = True, states: str = "predicted", foresight: str | bool = "off", B: int = 16,
                 select: str = "top", scores: str = "decoder", lam: float | None = None,
                 calibration: str | RowTemperature | None = None, fanout_ratio: float = 0.5,
                 draft_device: str | None = None, draft_copy: bool = False, pipeline: str = "auto",
                 record: bool = False, host: bool = False, random_init: bool = False, seed: int = 0) -> None:
        if head is None and random_init:  # an untrained head and adapter of the trainer's default shape
            head = random_head(NAME, self.attention, False, target, seed)
            cfg = head.config
            adapter = StateAdapter(target.config, AdapterConfig(taps=cfg.taps, layers=(1,) * len(cfg.taps),
                                                                block_size=cfg.block_size)).to(target.device)
            adapter.init_weights(target.model, seed=seed)
        if head is None:
            head, loaded = load_jetspecpp(target, checkpoint)
            adapter = adapter if adapter is not None else loaded
        self.attention = head.config.attention
        if not isinstance(draft_copy, bool):
            raise ValueError(f"draft_copy (the two-device path on one device) must be true or false, got {draft_copy!r}")
        self.draft_device = resolve_device(draft_device, target.device)
        # everything the drafter reads lives on the draft device (a copy of the target's weights there)
        self.separate = draft_copy or self.draft_device != target.device
        draft_target = target_copy(target, self.draft_device) if self.separate else target
        super().__init__(draft_target, head=head, block_size=block_size)
        if not isinstance(J, int) or isinstance(J, bool) or J < 0:
            raise ValueError(f"J (Jacobi refinement passes after J0) must be an integer >= 0, got {J!r}")
        if not isinstance(R, int) or isinstance(R, bool) or not 0 <= R <= J:
            raise ValueError(f"R (context refreshes) must be an integer in [0, J = {J}] (refresh j feeds pass j), got {R!r}")
        if not isinstance(replace, bool):
            raise ValueError(f"replace (anchor replacement) must be true or false, got {replace!r}")
        if states not in STATES:
            raise ValueError(f"states must be one of {STATES}, got {states!r}")
        if adapter is not None:
            if tuple(adapter.config.taps) != tuple(self.taps):
                raise ValueError(f"the adapter predicts taps {list(adapter.config.taps)} but the head reads {list(self.taps)}: "
                                 f"use the adapter trained with this head")
            adapter = adapter.to(device=self.target.device, dtype=self.target.dtype).eval().requires_grad_(False)
        if R > 0 and states == "predicted" and adapter is None:
            raise ValueError("R > 0 (context refresh) with states=predicted needs a state adapter and this head has none "
                             "(a plain jetspec head?): pass R=0, states=true|stale, or a jetspec++ checkpoint")
        self.adapter = adapter
        self.J, self.R, self.replace, self.states = J, R, replace, states
        self.top = max(self.taps)
        self.decoder: SliceDecoder | None = None
        self.adapter_caches: dict[int, ContextCache] = {}
        self.oracle: KVCache | None = None
        self.state_pending: list[Tensor] = []  # [1, k, m*d] tapped states of committed positions, not yet synced
        self.last_verified: Tensor | None = None  # [1, 1, m*d] the newest committed position's tapped states
        self.last_round: dict[str, list[Tensor]] = {}  # this round's refresh records (k_hat per refresh)
        self.last_logp: Tensor | None = None  # [D, V] the last drafted block's per-depth log-probs
        self.pipeline = Pipeline(self.draft_device, pipeline)
        self.foresight = self._foresight(foresight, B, select, scores, lam, calibration, fanout_ratio, record)
        if not isinstance(host, bool):
            raise ValueError(f"host (run the host-driven round, the reference) must be true or false, got {host!r}")
        # the device round: caches written from the Acceptance, no host read (module docstring)
        self.device_round = not host and not self.separate and (
            self.foresight is None or self.foresight.capturable)
        self.on_device = self.device_round  # this request's round (device foresight: T = 0 in decoding only)
        self.device_states: DeviceStates | None = None
        self.device_foresight = DeviceForesight(self, self.foresight) if self.device_round and self.foresight else None
        self.serving = False  # this request runs the device round's foresight (set in begin)
        self._branch = "miss"  # the device foresight round's next drafting stages: "hit" (served) or "miss"
        self._drafted = False  # a round was drafted in this request (so the next could be a hit)
        self.request: DraftState | None = None  # the request begun (its committed length sizes CPU reads)

    def _foresight(self, mode: str | bool, B: int, select: str, scores: str, lam: float | None,
                   calibration: str | RowTemperature | None, ratio: float, record: bool) -> Foresight | None:
        """The foresight state (None when off), the arguments checked."""
        if isinstance(mode, bool):
            mode = "on" if mode else "off"
        if mode not in MODES:
            raise ValueError(f"foresight must be one of {MODES} (or true/false), got {mode!r}")
        if mode == "off":
            return None
        if not self.tracks_states:
            raise ValueError("foresight drafts from predicted states and this head has no state adapter (a plain jetspec "
                             "head?): pass states=stale|true, a jetspec++ checkpoint, or foresight=off")
        if not isinstance(B, int) or isinstance(B, bool) or B < 1:
            raise ValueError(f"B (outcomes drafted ahead per round) must be an integer >= 1, got {B!r}")
        if select not in RULES:
            raise ValueError(f"select must be one of {RULES}, got {select!r}")
        if scores not in SCORES:
            raise ValueError(f"scores must be one of {SCORES} (whose rows rank the outcomes), got {scores!r}")
        if (select == "threshold") != (lam is not None):
            raise ValueError("lam (the threshold λ) goes with select=threshold and only with it: "
                             f"got select={select!r}, lam={lam!r}")
        if lam is not None and not (isinstance(lam, (int, float)) and 0 < lam <= 1):
            raise ValueError(f"lam must be a probability in (0, 1], got {lam!r}")
        if not isinstance(ratio, (int, float)) or ratio <= 0:
            raise ValueError(f"fanout_ratio must be > 0, got {ratio!r}")
        if isinstance(calibration, str) and calibration.lower() != "none":
            calibration = RowTemperature.load(calibration)
        elif isinstance(calibration, str):
            calibration = None
        return Foresight(self, mode, B, select, scores, lam, calibration, float(ratio), bool(record))

    @property
    def foresees(self) -> bool:
        """The host round's foresight hook (the device round's foresight is a stage: `side_phase`)."""
        return self.foresight is not None and not self.serving

    def capturable(self, policy: TreePolicy) -> bool:
        """The device round under `policy`. With foresight and a policy not capturable here (ddtree on
        the CPU) the drafter falls back to the host round's foresight for good (the engine asks before
        `begin`, which then sizes the host round's caches)."""
        ok = self.device_round and policy.capturable(self.target.device)
        if self.device_foresight is not None and not ok:
            self.device_round = self.on_device = False
            self.device_foresight = None
        return ok

    # ---- the device round's foresight (device_foresight.py) --------------------------------------
    @property
    def branches(self) -> bool:
        return self.device_foresight is not None

    @property
    def branch(self) -> str:
        return self._branch

    def branch_flag(self) -> Tensor:
        assert self.device_foresight is not None
        return self.device_foresight.hit

    def read_branch(self, flag: int) -> None:
        self._branch = "hit" if flag else "miss"

    def side_phase(self, state: DraftState, policy: TreePolicy, budget: int) -> Phase | None:
        """The foresight stage (the tree under verification -> the candidates of the next round)."""
        if not self.serving:
            return None
        fs = self.device_foresight
        assert fs is not None
        return ("foresight", lambda tree: fs.run(state, tree, policy, budget))

    @property
    def side_stream(self) -> "torch.cuda.Stream | None":
        return self.pipeline.side

    @property
    def tracks_states(self) -> bool:
        """Whether block states can be had (an adapter, or the stale / true ablation)."""
        return self.adapter is not None or self.states != "predicted"

    # ---- request state ---------------------------------------------------------------------------
    def begin(self, state: DraftState, prefill: ForwardOutput, max_seq_len: int) -> None:
        if self.foresight is not None:
            self.foresight.reset()
        prefill = ForwardOutput(logits=prefill.logits, hidden={t: self.pipeline.to_draft(prefill.hidden[t]) for t in self.taps})
        super().begin(state, prefill, max_seq_len)
        self.request = state
        # the device round's foresight serves greedy decoding; sampled or replayed requests take the host round
        self.serving = self.device_foresight is not None and state.sampling.greedy and state.reference is None
        self.on_device = self.device_round and (self.device_foresight is None or self.serving)
        if not self.tracks_states:
            return
        if self.serving:
            self.device_foresight.reset(state.tokens, max_seq_len)  # type: ignore[union-attr]
            self._branch, self._drafted = "miss", False
        if self.on_device:  # only the refreshes and the foresight stage read block states there
            return self._begin_device(state, prefill, max_seq_len) if self.R > 0 or self.device_foresight else None
        slots = max_seq_len + self.block_size + self._foresight_slots()  # block reads write after the committed positions
        if self.decoder is None or self.decoder.cache.max_seq_len < slots:
            self.decoder = SliceDecoder(self.target, self.top, slots)
            if self.states == "predicted":
                self.adapter_caches = {t: ContextCache(self.adapter.tap(t), self.target, slots) for t in self.taps}
            if self.states == "true":
                self.oracle = self.target.new_cache(slots)
        self.decoder.reset()
        for cache in self.adapter_caches.values():
            cache.reset()
        if self.oracle is not None:
            self.oracle.reset()
        self.state_pending = [self._features(prefill.hidden, slice(None))]
        self.last_verified = None

    def _begin_device(self, state: DraftState, prefill: ForwardOutput, max_seq_len: int) -> None:
        """The device round's state caches, sized once, fed the prompt's positions."""
        slots = max_seq_len + self.scratch_slots()  # as the draft cache: scratch past the prefix
        if self.device_states is None or self.device_states.max_seq_len < slots:
            taps = tuple(self.taps) if self.device_foresight is not None else (self.top,)  # the head reads every tap's
            self.device_states = DeviceStates(self.target, self.adapter, self.states, taps, self.top, slots)
        self.device_states.reset()
        n = prefill.hidden[self.top].shape[1]
        tokens = torch.tensor(state.tokens[:n], dtype=torch.long, device=self.target.device)
        self.device_states.commit(prefill.hidden, tokens, torch.full((1,), n, dtype=torch.long, device=tokens.device), n)

    def _foresight_slots(self) -> int:
        """Scratch slots the foresight blocks take past the tree's (`foresight.OutcomeBatch`: B x b flat rows)."""
        return self.foresight.B * self.block_size if self.foresight is not None and self.foresight.mode == "on" else 0

    def scratch_slots(self) -> int:
        return super().scratch_slots() + self._foresight_slots()

    def _device_states(self) -> DeviceStates:
        if self.device_states is None:
            raise RuntimeError("the device round keeps block states only with R > 0 (the refreshes read them) and after "
                               "begin(); pass drafter_args host=true to read them otherwise")
        return self.device_states

    def _kv_len(self, state: DraftState, q: int) -> int:
        """Slots a device-round pass over q new rows reads: on the CPU only the filled ones (the
        committed length is the state's), elsewhere the whole cache (one shape: capturable)."""
        assert self.device_states is not None
        return state.cache_len + q if self.target.device.type == "cpu" else self.device_states.max_seq_len

    def observe(self, tree: DraftTree, result: VerifyResult | Acceptance, target_out: ForwardOutput) -> None:
        """The accepted positions' true tapped states (one copy to the draft device) enter the draft
        cache and, queued, the adapter's, decoder's and oracle's caches, in place of anything predicted
        for them; with foresight, after the pass beside this verification is joined, the verified
        outcome is looked up in the speculation cache. The device round writes every cache at once
        from the `Acceptance` (the accepted rows padded to max_path, the count on the device)."""
        if self.on_device:
            acc = result if isinstance(result, Acceptance) else Acceptance.from_result(result, tree.num_nodes,
                                                                                         self.target.device)
            if self.serving:
                self.device_foresight.lookup(tree, acc.path, acc.count, acc.bonus)  # type: ignore[union-attr]
            rows = acc.path[: self.max_path].clamp(min=0)  # [P]
            assert self.cache is not None
            # every cache's committed length is the draft cache's (they move together): one set of slots
            # (= positions) and one RoPE table for the head's, the adapters' and the decoder's writes
            p, model = rows.shape[0], self.target.model
            slots = self.cache.lengths[:, None] + self.table(("arange", p), lambda: torch.arange(p, device=rows.device))
            rope = model.rope(slots)
            hidden = {t: target_out.hidden[t][:, rows] for t in self.taps}  # [1, P, d] per tap, gathered once
            self.write_context(torch.cat([hidden[t] for t in self.taps], dim=-1), acc.count, slots,
                               rope if rope[0].dtype == self.head.dtype else None)  # [1, P, m*d]: `_features`
            if self.device_states is not None:
                assert self.request is not None
                self.device_states.commit({t: hidden[t] for t in self.device_states.taps}, tree.tokens[rows], acc.count,
                                          self._kv_len(self.request, p), slots, rope)
            return
        if not isinstance(result, VerifyResult):
            raise TypeError(f"{self.name} is a host drafter: observe() takes the read VerifyResult")
        self.pipeline.join()
        path = list(result.path)
        feats = self.pipeline.to_draft(self._features(target_out.hidden, path))  # [1, k+1, m*d]
        self.write_context(feats, torch.full((1,), len(path), dtype=torch.long, device=feats.device))
        if self.tracks_states:
            self.state_pending.append(feats)
        if self.foresight is not None:
            self.foresight.settle(tree, result)

    def _tap_slice(self, features: Tensor, tap: int) -> Tensor:
        """The states of one tap from features concatenated in tap order [..., m*d] -> [..., d]."""
        d = self.target.config.hidden_size
        i = self.taps.index(tap)
        return features[..., i * d: (i + 1) * d]

    @torch.no_grad()
    def _sync_states(self, state: DraftState) -> None:
        """Feed the queued committed positions to the decoder's, the adapters' (and the oracle's) caches."""
        assert self.decoder is not None, "begin() was not called (or this drafter tracks no states)"
        feats = torch.cat(self.state_pending, dim=1) if len(self.state_pending) > 1 else self.state_pending[0]
        start, k = self.decoder.length, feats.shape[1]
        if start + k != state.cache_len:
            raise RuntimeError(f"state caches out of step: {start + k} positions for {state.cache_len} committed tokens")
        self.decoder.extend(self._tap_slice(feats, self.top))
        for tap, cache in self.adapter_caches.items():
            cache.extend(self._tap_slice(feats, tap))
        if self.oracle is not None and k > 0:
            ids = torch.tensor([state.tokens[start: start + k]], dtype=torch.long, device=self.target.device)
            pos = torch.arange(start, start + k, device=ids.device)[None]
            self.target.model(ids, pos, self.oracle, None, (), logits_rows="last", kv_len=start + k)
            self.oracle.advance(k)
        if k > 0:
            self.last_verified = feats[:, -1:]
        self.state_pending = [feats[:, :0]]

    # ---- block states and the decoder ------------------------------------------------------------
    @torch.no_grad()
    def block_states(self, state: DraftState, tokens: Tensor, depth: Tensor, within: Tensor,
                     taps: tuple[int, ...] | None = None) -> dict[int, Tensor]:
        """States [1, Q, d] per tap of block/tree rows `tokens` [Q] at positions committed + depth,
        within-block mask [Q, Q]: predicted by the adapter, stale, or true (the `states` setting)."""
        taps = tuple(self.taps) if taps is None else taps
        if self.on_device:
            return self._device_states().block(tokens, depth, within, taps, self._kv_len(state, tokens.shape[0]))
        self._sync_states(state)
        n, q = state.cache_len, tokens.shape[0]
        positions = (n + depth)[None]
        if self.states == "stale":
            return {t: self._tap_slice(self.last_verified, t).expand(1, q, -1) for t in taps}
        if self.states == "true":
            out = self.target.model(tokens[None], positions, self.oracle, within[None], taps,
                                    logits_rows=torch.zeros(1, dtype=torch.long, device=tokens.device), kv_len=n + q)
            return {t: out.hidden[t] for t in taps}
        mask = torch.cat([torch.ones(q, n, dtype=torch.bool, device=within.device), within], dim=1)[None]
        return {t: self.adapter.tap(t)(tokens[None], positions, self.adapter_caches[t].kv(), mask, self.target.model)
                for t in taps}

    @torch.no_grad()
    def decoder_logits(self, state: DraftState, tokens: Tensor, depth: Tensor, within: Tensor,
                       plan: BlockPlan | None = None) -> Tensor:
        """[Q, V] fp32 logits of p̂(.|row) from the top tap's block states (row j: the token after row j);
        plan: the device round's plan of this read (`DeviceStates.plan`), if the caller has it."""
        if self.on_device:
            return self._device_states().decoder_logits(tokens, depth, within, self._kv_len(state, tokens.shape[0]),
                                                        plan)
        h_top = self.block_states(state, tokens, depth, within, taps=(self.top,))[self.top]
        return self.decoder.read(h_top, depth, within)

    def outcome_distribution(self, state: DraftState, drafts: Tensor, sampling: SamplingConfig | None = None) -> Tensor:
        """P̂(k, a) [γ+1, V] (float64, sums to 1) for the chain anchor -> drafts [γ]: rows p̂ from the
        decoder, processed by `sampling` (None or greedy: the decoder's plain softmax)."""
        tokens = torch.cat([drafts.new_full((1,), state.anchor), drafts])
        q = tokens.shape[0]
        dev = tokens.device
        logits = self.decoder_logits(state, tokens, torch.arange(q, device=dev), block_pattern(q, "block-causal", dev))
        probs = process_logits(logits, sampling) if sampling is not None and not sampling.greedy else logits.softmax(-1)
        return outcome_distribution(drafts, probs)

    def refresh(self, state: DraftState, drafts: Tensor, plan: BlockPlan | None = None) -> tuple[Tensor, Tensor]:
        """Context refresh of drafts [D]: (drafts, with the decoder's token at depth k̂+1 when
        `replace`; k̂ as a 0-dim tensor). On the device, no host read; plan: the device round's plan of
        the block read (`_draft_plan`), if the caller has it."""
        dev = drafts.device
        b = drafts.shape[0] + 1
        tokens = torch.cat([state.anchor_on(dev), drafts])
        within = plan.meta.tree_mask[0] if plan is not None else block_pattern(b, "block-causal", dev)
        depth = self.table(("arange", b), lambda: torch.arange(b, device=dev))
        logits = self.decoder_logits(state, tokens, depth, within, plan)
        top1 = logits.max(dim=-1).indices[:-1]  # [D]: row i predicts depth i+1
        k_hat = (top1 == drafts).long().cumprod(0).sum()
        if self.replace:
            drafts = torch.where(depth[:-1] == k_hat, top1, drafts)
        return drafts, k_hat

    # ---- drafting ------------------------------------------------------------------------------
    def refined_logp(self, state: DraftState) -> Tensor:
        """The last pass's per-depth log-probs [D, V] after J0 and J refinement passes, every pass over the
        same rows: one plan (mask, RoPE, slots) for all (`_draft_plan`)."""
        b, dev = self.block_size, self.target.device
        depth = self.table(("arange", b), lambda: torch.arange(b, device=dev))
        within = self.table(("block pattern", b, self.attention), lambda: block_pattern(b, self.attention, dev))
        plan, refresh_plan = self._draft_plan(state, depth, within)
        # a pass read only by its argmax (every one but the last) skips the fp32 cast and log-softmax
        logp = self.run_block(state, state.anchor_on(dev).expand(b), depth > 0, depth, within, plan,
                              log_probs=self.J == 0)[1:]  # J0: [D, V]
        drafts = top1(logp)  # first maximal index (the chain policy's tie rule on the last pass's log-probs)
        k_hats: list[Tensor] = []
        for j in range(1, self.J + 1):
            if j <= self.R:
                drafts, k_hat = self.refresh(state, drafts, refresh_plan)
                k_hats.append(k_hat)
            inputs = torch.cat([state.anchor_on(dev), drafts])
            logp = self.run_block(state, inputs, None, depth, within, plan, log_probs=j == self.J)[1:]
            if j < self.J:  # the last pass's tokens are the tree's business
                drafts = top1(logp)
        self.last_round = {"k_hat": k_hats}
        return logp

    def _draft_plan(self, state: DraftState, depth: Tensor, within: Tensor) -> tuple[BlockPlan, BlockPlan | None]:
        """(the head passes' plan, the refreshes' or None): in the device round with block-causal heads one
        plan over the block's rows serves the head, the top tap's adapter and the decoder (their caches
        move together); otherwise the head's own (`block_plan`) and None (the refresh plans its read)."""
        if self.on_device and self.device_states is not None and self.R > 0 and self.attention == "block-causal":
            plan = self.device_states.plan(depth, within, self._kv_len(state, depth.shape[0]), batch=1)
            return plan, plan
        return self.block_plan(state, depth, within), None

    def phases(self, state: DraftState, policy: TreePolicy, budget: int) -> list[Phase]:
        """The device round's stages (refined scores, then the tree), else `draft` as one stage."""
        if not self.on_device or state.want_draft_probs:
            return super().phases(state, policy, budget)
        anchor = state.anchor_on(self.target.device)
        if self.serving:
            assert self.foresight is not None
            hit = self._branch == "hit"
            self.foresight.hit = hit if self._drafted else None
            self.foresight.log.append({"request": self.foresight.request, "hit": self.foresight.hit})
            self._drafted = True
            if hit:  # the tree drafted ahead for the verified outcome: no drafting on the critical path
                return [("tree", lambda _: self.device_foresight.serve())]  # type: ignore[union-attr]
            # the ancestor mask (a cached property) is computed in this stage, before the foresight stage
            # forks off: computed lazily by the verify forward, a side stream could read last round's
            return [("draft", lambda _: DepthScores(anchor, self.refined_logp(state))),
                    ("tree", lambda scores: _with_mask(policy.build(scores, budget)))]
        return [("draft", lambda _: DepthScores(anchor, self.refined_logp(state))),  # [D, V]
                ("tree", lambda scores: policy.build(scores, budget))]

    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        """The block drafted ahead for the verified outcome (a foresight hit), else the refined draft
        from the committed (true) states; then the tree under `policy` (or a sampled chain)."""
        entry = self.foresight.take(state) if self.foresight is not None else None
        if entry is not None:
            logp = entry.block
            self.last_round = {"k_hat": entry.meta["k_hat"]}
        else:
            logp = self.refined_logp(state)
        self.last_logp = logp
        if state.want_draft_probs:
            tree = self.sample_chain(state, policy, logp[:budget])
        else:
            tree = policy.build(DepthScores(state.anchor, logp), budget)
        if self.foresight is not None:
            self.pipeline.fork()  # the tree and the states the next pass reads are enqueued before this point
        return tree

    def foresee(self, state: DraftState, tree: DraftTree) -> None:
        """The engine has enqueued the verify forward of `tree`: start the foresight pass beside it."""
        assert self.foresight is not None and self.last_logp is not None
        self.foresight.launch(state, tree, self.last_logp)

    def sample_chain(self, state: DraftState, policy: TreePolicy, logp: Tensor) -> DraftTree:
        """One token per depth from the last pass's processed law, recorded as the draft law."""
        if policy.name != "chain":
            raise ValueError(f"{self.name}: sampled drafts (the verifier reads draft probabilities) need the chain policy, "
                             f"not {policy.name!r}; use a walk verifier (greedy / sample-walk) for trees")
        probs = process_logits(logp, state.sampling)  # [D, V]
        tokens = [state.draft_rng.categorical(row) for row in probs]
        return DraftTree.chain(state.anchor, tokens, draft_probs=probs, device=self.target.device)


def _with_mask(tree: DraftTree) -> DraftTree:
    """`tree` with its ancestor mask computed now (in the stage that builds it)."""
    tree.ancestor_mask  # noqa: B018
    return tree
