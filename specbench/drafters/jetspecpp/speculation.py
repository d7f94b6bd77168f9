"""One round of foresight (methods.md §5.2) for the `jetspec++` drafter: P̂ of the block under
verification, the selection, the blocks drafted ahead, the speculation cache, and optionally a record
of the round for the offline hit-rate evaluator (`specbench.bench.hit_rate`).

    launch  (the engine's `foresee`: after the verify forward is enqueued; a side stream on CUDA)
        states = predicted tapped states of the tree's nodes (the drafter's state source)
        rows   = the decoder's p̂ for every node (per-depth calibrated; processed by the sampling
                 settings, as the target's rows are), or the draft's own rows (its raw per-depth laws)
        sel    = the rule's B outcomes (`selection.py`), copied to the host
        blocks = the next block of every selected outcome, batched (`foresight.OutcomeBatch`); mode "on"
    settle  (the drafter's `observe`, once the verify result is read)
        join; the cache is filled with the valid selected outcomes (keyed in tokens) and the verified
        outcome's entry, if there is one, is handed to the next draft (a hit: no drafting on the
        critical path); a miss drafts there from the true states. The entry's predicted states are
        dropped either way: the accepted positions' true states enter the drafter's caches as in
        every round, so later rounds read true states only.

Non-anticipation (methods.md §1.5): launch reads the committed context and the block's tokens, never
the verify forward's output, and the next round depends on the verified outcome only through the
lookup made after verification decided it. The next tree is thus a function of the committed tokens
(and the drafter's own randomness, drawn after the lookup), as for any drafter: every lossless
verifier stays lossless (tested by exact enumeration).

Modes: "on" drafts ahead and serves hits; "score" computes P̂ and the selection every round but
drafts nothing ahead (the rounds are the critical path's: what the offline evaluator records).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from specbench.drafters.base import DraftState
from specbench.drafters.jetspecpp.cache import Entry, Outcome, SpeculationCache
from specbench.drafters.jetspecpp.calibration import GRID, RowTemperature
from specbench.drafters.jetspecpp.foresight import OutcomeBatch
from specbench.drafters.jetspecpp.ngram import ORDERS, ContextStats, boost, tree_levels
from specbench.drafters.jetspecpp.selection import RowLaw, RowStats, draft_rows, select
from specbench.trees.base import DraftTree
from specbench.verify.base import VerifyResult
from specbench.verify.sampling import process_logits

if TYPE_CHECKING:
    from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter

MODES = ("off", "on", "score")
SCORES = ("decoder", "draft")
RECORD_B = 16  # records keep each row's top (16 + N) tokens: every rule is exact up to B = 16


@dataclass
class RoundRecord:
    """One verified block, for the offline evaluator: the tree (host lists), the decoder's rows as
    `RowStats` on `calibration.GRID`, the draft model's own rows (`RowLaw`), the verified outcome
    (the node where the walk stopped, the bonus and the decoder's raw logit of the bonus in that
    node's row), whether the drafter's own rule had selected it, and whether this round's block was
    served from the cache (None: no foresight ran before it); `context`: the context n-gram expert's
    continuations of every node (`ngram.ContextStats`, levels 1..ngram.LEVELS; None in older records)."""

    tokens: list[int]
    parents: list[int]
    depth: list[int]
    decoder: RowStats
    draft: RowLaw
    node: int
    bonus: int
    bonus_logit: float
    in_selection: bool
    hit: bool | None = None
    context: ContextStats | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "parents": self.parents, "depth": self.depth, "node": self.node,
                "bonus": self.bonus, "bonus_logit": self.bonus_logit, "in_selection": self.in_selection, "hit": self.hit,
                "decoder": vars(self.decoder), "draft": vars(self.draft),
                "context": vars(self.context) if self.context is not None else None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RoundRecord":
        ctx = d.get("context")
        return cls(tokens=d["tokens"], parents=d["parents"], depth=d["depth"], decoder=RowStats(**d["decoder"]),
                   draft=RowLaw(**d["draft"]), node=d["node"], bonus=d["bonus"], bonus_logit=d["bonus_logit"],
                   in_selection=d["in_selection"], hit=d["hit"], context=ContextStats(**ctx) if ctx else None)


@dataclass
class _Pass:
    """A launched foresight pass: what settle needs."""

    base: int
    selection: Tensor  # [3, B] host copy (nodes, tokens, valid) once `ready` has fired
    ready: Any
    states: Tensor  # [1, N, m*d] predicted features of the tree's nodes
    blocks: Tensor | None  # [B, D, V] the blocks drafted ahead (mode "on")
    k_hats: list[Tensor]
    logits: Tensor | None  # [N, V] the decoder's logits (kept when recording)
    record: tuple[RowStats, RowLaw, ContextStats] | None


class Foresight:
    """The foresight state of one `JetSpecPPDrafter` (see the module docstring)."""

    def __init__(self, drafter: "JetSpecPPDrafter", mode: str, B: int, select: str, scores: str, lam: float | None,
                 calibration: RowTemperature | None, ratio: float, record: bool) -> None:
        self.drafter = drafter
        self.mode, self.B, self.rule, self.scores, self.lam, self.ratio = mode, B, select, scores, lam, ratio
        self.calibration = calibration
        self.record = record
        self.cache = SpeculationCache()
        self.pending: _Pass | None = None
        self.ready: Entry | None = None
        self.launched = False  # a pass ran in this request (so the next draft could have been a hit)
        self.hit: bool | None = None  # whether the last drafted block was served from the cache
        self.request = -1
        self.log: list[dict[str, Any]] = []  # per drafted round: {"request": i, "hit": True | False | None}
        self.records: list[RoundRecord] = []

    @property
    def capturable(self) -> bool:
        """Whether the device round can run this foresight (`device_foresight.py`): blocks drafted ahead
        from the adapter's predicted states, outcomes ranked by the decoder's rows, no records."""
        return self.mode == "on" and not self.record and self.scores == "decoder" and self.drafter.states == "predicted"

    def reset(self) -> None:
        """A new request (the round log and records are kept until `clear_log`)."""
        self.drafter.pipeline.join()
        self.pending, self.ready, self.launched, self.hit = None, None, False, None
        self.cache.clear()
        self.request += 1

    def clear_log(self) -> None:
        self.log, self.records = [], []

    # ---- the next draft --------------------------------------------------------------------------
    def take(self, state: DraftState) -> Entry | None:
        """The block drafted ahead for the verified outcome (a hit) or None; logs the round."""
        entry, self.ready = self.ready, None
        if entry is not None:
            o = entry.outcome
            if o.base + len(o.accepted) + 1 != state.cache_len or o.bonus != state.anchor:
                raise RuntimeError(f"the speculation cache served a block drafted for {o} at committed length "
                                   f"{state.cache_len} with anchor {state.anchor}")
        self.hit = entry is not None if self.launched and self.mode == "on" else None
        self.log.append({"request": self.request, "hit": self.hit})
        return entry

    # ---- the pass beside verification ------------------------------------------------------------
    def launch(self, state: DraftState, tree: DraftTree, draft_logp: Tensor) -> None:
        d = self.drafter
        base = state.cache_len
        self.launched = True

        def work() -> _Pass:
            states = d.block_states(state, tree.tokens, tree.depth, tree.ancestor_mask)  # tap -> [1, N, d]
            assert d.decoder is not None
            logits = d.decoder.read(states[d.top], tree.depth, tree.ancestor_mask)  # [N, V] fp32
            k = min(logits.shape[-1], self.B + tree.num_nodes)
            if self.scores == "draft":
                law = RowLaw.from_logp(draft_rows(draft_logp, tree.depth),
                                       tree.tokens, tree.parents, k)
            else:
                law = self.decoder_law(logits, tree, state, k)
            sel = select(self.rule, law, tree.tokens, tree.parents, tree.depth, tree.ancestor_mask, self.B,
                         lam=self.lam, ratio=self.ratio)
            host, ready = d.pipeline.to_host(sel.packed())
            feats = torch.cat([states[t] for t in d.taps], dim=-1)
            blocks, k_hats = None, []
            if self.mode == "on":
                blocks, k_hats = OutcomeBatch(d, state, tree, states, sel.nodes, sel.tokens).refined_logp()
            rec = None
            if self.record:
                kr = min(logits.shape[-1], RECORD_B + tree.num_nodes)
                rec = (RowStats.from_logits(logits, tree.tokens, tree.parents, kr, GRID).to("cpu"),
                       RowLaw.from_logp(draft_rows(draft_logp, tree.depth),
                                        tree.tokens, tree.parents, kr).to("cpu"),
                       ContextStats.from_levels(self.levels(state, tree, ORDERS, logits.shape[-1]), logits))
            return _Pass(base=base, selection=host, ready=ready, states=feats, blocks=blocks, k_hats=k_hats,
                         logits=logits if self.record else None, record=rec)

        self.pending = d.pipeline.launch(work, tree.tokens, *d.state_pending)

    def levels(self, state: DraftState, tree: DraftTree, orders: int, vocab: int) -> Tensor:
        """[N, V]: the context n-gram level of every token in every node's row, keys of up to `orders`
        tokens (`ngram.py`)."""
        dev = tree.tokens.device
        context = torch.tensor(state.tokens, dtype=torch.long, device=dev)
        length = torch.full((1,), state.cache_len, dtype=torch.long, device=dev)
        return tree_levels(context, length, tree.tokens, tree.depth, tree.ancestor_mask, orders, vocab)

    def decoder_law(self, logits: Tensor, tree: DraftTree, state: DraftState, k: int) -> RowLaw:
        """The decoder's rows at the calibrated inverse temperatures (beta = 1 uncalibrated), with the
        calibration's context n-gram boosts if it has any, processed by the sampling settings when
        they sample."""
        cal = self.calibration or RowTemperature.identity()
        sampling = state.sampling
        if cal.etas:
            etas = torch.tensor(cal.etas, dtype=torch.float64, device=logits.device)
            z = logits.to(torch.float64) * cal.beta(tree.depth)[:, None] \
                + boost(self.levels(state, tree, len(cal.etas) - 1, logits.shape[-1]), etas)  # [N, V]
            rows = z.log_softmax(dim=-1) if sampling.greedy else process_logits(z, sampling).log()
            return RowLaw.from_logp(rows, tree.tokens, tree.parents, k)
        if sampling.greedy:
            betas = torch.tensor(cal.betas, dtype=torch.float64)  # on the CPU: RowStats reads them
            stats = RowStats.from_logits(logits, tree.tokens, tree.parents, k, betas)
            column = tree.depth.clamp(max=len(cal.betas) - 1)
            return stats.law(column, tree.parents)
        scaled = logits.to(torch.float64) * cal.beta(tree.depth)[:, None]
        return RowLaw.from_logp(process_logits(scaled, sampling).log(), tree.tokens, tree.parents, k)

    # ---- the verify result -----------------------------------------------------------------------
    def settle(self, tree: DraftTree, result: VerifyResult) -> None:
        """After the drafter's `observe` joined the pass: fill the cache, look up the verified outcome."""
        p, self.pending = self.pending, None
        if p is None:
            return
        self.drafter.pipeline.wait_host(p.ready)
        nodes, bonus, valid = p.selection.tolist()
        tokens, _, depth = tree.host
        verified = Outcome(p.base, tuple(result.tokens[:-1]), result.tokens[-1])
        entries, chosen = [], set()
        for row, (u, a, ok) in enumerate(zip(nodes, bonus, valid)):
            if not ok:
                continue
            path = tree.path_to(u)
            outcome = Outcome(p.base, tuple(tokens[v] for v in path[1:]), a)
            chosen.add(outcome)
            if p.blocks is not None:
                entries.append(Entry(outcome=outcome, node=u, row=row, path=tuple(path), states=p.states,
                                     block=p.blocks[row], meta={"k_hat": [k[row] for k in p.k_hats]}))
        if p.blocks is not None:
            self.cache.fill(entries)
            self.ready = self.cache.take(verified)
        if p.record is not None:
            assert p.logits is not None
            u_star = result.path[-1]
            _, parents, _ = tree.host
            self.records.append(RoundRecord(
                tokens=list(tokens), parents=list(parents), depth=list(depth), decoder=p.record[0], draft=p.record[1],
                node=u_star, bonus=verified.bonus, bonus_logit=float(p.logits[u_star, verified.bonus]),
                in_selection=verified in chosen, hit=self.hit, context=p.record[2]))
