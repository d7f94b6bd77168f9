"""Offline hit rate of foresight's selection rules on recorded rounds (JetSpec++ Tables 10 and 11).

A `RoundRecord` (`specbench.drafters.jetspecpp.speculation`) keeps one verified block: the tree, the
decoder's rows (`RowStats` on the calibration grid), the draft model's own rows and the verified
outcome. A rule hits on a round when the verified outcome is among the B outcomes it selects. The
rules are Table 11's rows:

  calibrated    top-B of P̂ over the decoder's rows at fitted per-depth temperatures (the served rule)
  calibrated-ngram  the same with the context n-gram expert (`ngram.py`): per-depth temperatures and
                per-level boosts fitted jointly (needs records with context stats)
  uncalibrated  top-B of P̂ over the raw decoder rows
  threshold     calibrated score >= λ, at most B (reported with the mean number selected)
  draft         top-B of the outcome law of the draft model's own per-depth rows
  ssd           SSD-style geometric fan-out over the draft's rows (no decoder anchors)
  ssd-decoder   the same fan-out over the decoder's rows (decoder anchors)

Calibration is cross-fitted: prompts are split into folds, and each fold's rounds are scored with
temperatures fitted on the other folds' rounds, so no hit rate is measured on rounds its calibration
saw (`cross_fit`). A miss is split into "wrong k" (no selected outcome stops at the verified node)
and "wrong anchor" (some do, none with the verified bonus). Reliability of the scores: the mean
negative log-likelihood of the verified outcome (nats per round) and the expected calibration error
of the top-B outcomes' scores (binned score against how often that outcome was the verified one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from specbench.drafters.jetspecpp.calibration import GRID, RowTemperature, ngram_nll, row_nll
from specbench.drafters.jetspecpp.ngram import LEVELS, boosted_law
from specbench.drafters.jetspecpp.selection import RowLaw, Selection, select
from specbench.drafters.jetspecpp.speculation import RoundRecord

RULE_NAMES = ("calibrated", "calibrated-ngram", "uncalibrated", "threshold", "draft", "ssd", "ssd-decoder")


@dataclass(frozen=True)
class RuleSpec:
    """How a rule name maps onto `selection.select`: the rule, whose rows, calibrated or not."""

    select: str
    rows: str  # decoder | draft
    calibrated: bool
    ngram: bool = False  # the calibration fits the context n-gram expert too


RULES = {
    "calibrated": RuleSpec("top", "decoder", True),
    "calibrated-ngram": RuleSpec("top", "decoder", True, ngram=True),
    "uncalibrated": RuleSpec("top", "decoder", False),
    "threshold": RuleSpec("threshold", "decoder", True),
    "draft": RuleSpec("top", "draft", False),
    "ssd": RuleSpec("ssd", "draft", False),
    "ssd-decoder": RuleSpec("ssd", "decoder", False),
}


class _Tree:
    """A record's tree as tensors (what the selection reads)."""

    def __init__(self, rec: RoundRecord) -> None:
        self.tokens = torch.tensor(rec.tokens)
        self.parents = torch.tensor(rec.parents)
        self.depth = torch.tensor(rec.depth)
        n = len(rec.tokens)
        mask = torch.eye(n, dtype=torch.bool)
        for v in range(1, n):
            mask[v] |= mask[rec.parents[v]]
        self.ancestors = mask


def path_of(rec: RoundRecord, node: int) -> list[int]:
    out = [node]
    while rec.parents[out[-1]] >= 0:
        out.append(rec.parents[out[-1]])
    return out[::-1]


def decoder_law(rec: RoundRecord, cal: RowTemperature | None) -> RowLaw:
    """The record's decoder rows at the calibration's per-depth temperatures (raw when None), with its
    n-gram boosts if it has any."""
    depth = torch.tensor(rec.depth)
    cal = cal or RowTemperature.identity()
    column = rec.decoder.column_of(_on_grid(cal.beta(depth)))
    if not cal.etas:
        return rec.decoder.law(column, torch.tensor(rec.parents))
    _check_context(rec, cal)
    assert rec.context is not None
    return boosted_law(rec.decoder, column, torch.tensor(rec.parents), rec.context,
                       torch.tensor(cal.etas, dtype=torch.float64), torch.tensor(rec.tokens))


def _check_context(rec: RoundRecord, cal: RowTemperature) -> None:
    if rec.context is None:
        raise ValueError("an n-gram calibration needs records with context stats: record the rounds again "
                         "(scripts/foresight_hits.py without --eval-only, into a new --out)")
    if len(cal.etas) > LEVELS:
        raise ValueError(f"records keep n-gram levels up to {LEVELS}, the calibration has {len(cal.etas)}")


def _on_grid(beta: Tensor) -> Tensor:
    """Inverse temperatures snapped to the record grid (fitted ones are on it already)."""
    grid = GRID.to(beta)
    return grid[(beta[:, None].log() - grid[None, :].log()).abs().argmin(dim=1)]


def selection(rec: RoundRecord, rule: str, B: int, cal: RowTemperature | None, lam: float | None = None,
              ratio: float = 0.5) -> Selection:
    spec = RULES[rule]
    law = decoder_law(rec, cal if spec.calibrated else None) if spec.rows == "decoder" else rec.draft
    t = _Tree(rec)
    return select(spec.select, law, t.tokens, t.parents, t.depth, t.ancestors, B,
                  lam=lam if spec.select == "threshold" else None, ratio=ratio)


def hit(rec: RoundRecord, sel: Selection) -> bool:
    """Whether the verified outcome (the walk's last node, the bonus) is a valid selected outcome."""
    chosen = sel.valid & (sel.nodes == rec.node) & (sel.tokens == rec.bonus)
    return bool(chosen.any())


def visited_rows(rec: RoundRecord) -> tuple[Tensor, Tensor, Tensor]:
    """The rows the verified walk read: (depth [k+1], the label's raw logit [k+1], lse [k+1, G]); the
    label of a path row is the next path node's token, of the last row the bonus."""
    path = path_of(rec, rec.node)
    idx = torch.tensor(path)
    labels = [float(rec.decoder.child_logit[v]) for v in path[1:]] + [rec.bonus_logit]
    return torch.tensor(rec.depth)[idx], torch.tensor(labels, dtype=torch.float64), rec.decoder.lse[idx]


def visited_context(rec: RoundRecord) -> tuple[Tensor, Tensor, Tensor]:
    """The n-gram side of `visited_rows`: (the label's level [k+1], the continuations' raw logits and
    levels [k+1, C])."""
    if rec.context is None:
        raise ValueError("an n-gram calibration needs records with context stats: record the rounds again")
    path = path_of(rec, rec.node)
    labels = torch.tensor([rec.tokens[v] for v in path[1:]] + [rec.bonus])
    idx = torch.tensor(path)
    ids, levels = rec.context.ids[idx], rec.context.levels[idx]
    label_level = torch.where(ids == labels[:, None], levels, 0).amax(dim=1)
    return label_level, rec.context.logits[idx], levels


def _padded_cat(parts: Sequence[Tensor]) -> Tensor:
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])


def fit_calibration(records: Sequence[RoundRecord], min_rows: int = 32, ngram: bool = False,
                    levels: int = LEVELS) -> RowTemperature:
    """Per-depth temperatures by maximum likelihood of the verified outcomes (`RowTemperature.fit`);
    with `ngram`, jointly with the context n-gram boosts of levels 1..levels (<= ngram.LEVELS)."""
    rows = [visited_rows(r) for r in records]
    depth, label, lse = (torch.cat([r[i] for r in rows]) for i in range(3))
    if not ngram:
        return RowTemperature.fit(depth, label, lse, GRID, min_rows=min_rows)
    ctx = [visited_context(r) for r in records]
    return RowTemperature.fit_ngram(depth, label, lse, torch.cat([c[0] for c in ctx]), _padded_cat([c[1] for c in ctx]),
                                    _padded_cat([c[2] for c in ctx]), levels, GRID, min_rows=min_rows)


def outcome_nll(rec: RoundRecord, cal: RowTemperature | None) -> float:
    """-log P~(verified outcome) in nats: the visited rows' NLL at their depths' temperatures (and the
    calibration's n-gram boosts)."""
    depth, label, lse = visited_rows(rec)
    cal = cal or RowTemperature.identity()
    beta = _on_grid(cal.beta(depth))
    col = (beta[:, None] == GRID.to(beta)[None, :]).long().argmax(dim=1)
    if not cal.etas:
        return float(row_nll(label, lse).gather(1, col[:, None]).sum())
    _check_context(rec, cal)
    order, cand_logit, cand_order = visited_context(rec)
    lse_col = lse.gather(1, col[:, None])
    return float(ngram_nll(beta[:, None], lse_col, label, order, cand_logit, cand_order,
                            torch.tensor(cal.etas, dtype=torch.float64)).sum())


def cross_fit(prompts: Sequence[tuple[str, list[RoundRecord]]], folds: int, fit) -> list[RowTemperature]:  # type: ignore[no-untyped-def]
    """Per prompt, the calibration `fit(rounds)` fitted on the rounds of the other folds' prompts only
    (prompt i is in fold i mod folds): no prompt is scored with a calibration that saw it."""
    fold_of = [i % folds for i in range(len(prompts))]
    cals = []
    for f in range(folds):
        train = [r for (_, rounds), g in zip(prompts, fold_of) if g != f for r in rounds]
        cals.append(fit(train) if train else RowTemperature.identity())
    return [cals[g] for g in fold_of]


def calibration_error(scored: Sequence[tuple[RoundRecord, RowTemperature | None]], B: int = 16, bins: int = 10) -> float:
    """Expected calibration error of the top-B outcomes' scores (probability bins of equal width) over
    rounds each scored with its own calibration (None: raw rows)."""
    scores, hits = [], []
    for rec, cal in scored:
        rule = "uncalibrated" if cal is None else "calibrated-ngram" if cal.etas else "calibrated"
        sel = selection(rec, rule, B, cal)
        for i in range(B):
            if bool(sel.valid[i]):
                scores.append(math.exp(float(sel.score[i])))
                hits.append(float(int(sel.nodes[i]) == rec.node and int(sel.tokens[i]) == rec.bonus))
    if not scores:
        return 0.0
    s, h = torch.tensor(scores), torch.tensor(hits)
    which = (s * bins).long().clamp(max=bins - 1)
    err = 0.0
    for b in range(bins):
        m = which == b
        if bool(m.any()):
            err += float(m.sum()) / len(s) * abs(float(s[m].mean()) - float(h[m].mean()))
    return err


def evaluate(prompts: Sequence[tuple[str, list[RoundRecord]]], Bs: Sequence[int] = (1, 4, 8, 16),
             rules: Sequence[str] | None = None, lam: float = 0.01, ratio: float = 0.5, folds: int = 2,
             min_rows: int = 32) -> tuple[list[dict], list[dict], list[RowTemperature]]:
    """Hit rates and the miss split per (dataset, rule, B) over `prompts` = [(dataset, rounds)], each
    calibration cross-fitted over `folds` folds of prompts (`cross_fit`); reliability rows per
    dataset; the per-prompt calibrations (n-gram ones after the plain ones when a rule needs them).
    rules None: every rule the records support (calibrated-ngram needs context stats)."""
    has_context = all(r.context is not None for _, rounds in prompts for r in rounds)
    if rules is None:
        rules = [r for r in RULE_NAMES if has_context or not RULES[r].ngram]
    bad = [r for r in rules if r not in RULES]
    if bad:
        raise ValueError(f"unknown rules {bad}; choose from {list(RULES)}")
    ngram = any(RULES[r].ngram for r in rules)
    plain = cross_fit(prompts, folds, lambda rs: fit_calibration(rs, min_rows))
    boosted = cross_fit(prompts, folds, lambda rs: fit_calibration(rs, min_rows, ngram=True)) if ngram else plain
    counts: dict[tuple[str, str, int], list[float]] = {}
    nll: dict[str, list[list[float]]] = {}
    by_dataset: dict[str, list[tuple[RoundRecord, RowTemperature, RowTemperature]]] = {}
    for (dataset, rounds), cal, cal_ng in zip(prompts, plain, boosted):
        for rec in rounds:
            by_dataset.setdefault(dataset, []).append((rec, cal, cal_ng))
            nll.setdefault(dataset, []).append([outcome_nll(rec, None), outcome_nll(rec, cal)]
                                               + ([outcome_nll(rec, cal_ng)] if ngram else []))
            for rule in rules:
                spec = RULES[rule]
                use = (cal_ng if spec.ngram else cal) if spec.calibrated else None
                for B in Bs:
                    sel = selection(rec, rule, B, use, lam=lam, ratio=ratio)
                    c = counts.setdefault((dataset, rule, B), [0.0] * 5)
                    h = hit(rec, sel)
                    right_k = bool((sel.valid & (sel.nodes == rec.node)).any())
                    c[0] += h
                    c[1] += 1
                    c[2] += float(sel.valid.sum())
                    c[3] += not right_k
                    c[4] += right_k and not h
    rows = [{"dataset": d, "rule": rule, "B": B, "hit_rate": c[0] / c[1], "rounds": int(c[1]), "mean_selected": c[2] / c[1],
             "miss_wrong_k": c[3] / c[1], "miss_wrong_anchor": c[4] / c[1]}
            for (d, rule, B), c in counts.items()]
    reliability = []
    for d, values in nll.items():
        scored = by_dataset[d]
        row = {"dataset": d, "rounds": len(values),
               "nll_uncalibrated": sum(v[0] for v in values) / len(values),
               "nll_calibrated": sum(v[1] for v in values) / len(values),
               "ece_uncalibrated": calibration_error([(r, None) for r, _, _ in scored]),
               "ece_calibrated": calibration_error([(r, c) for r, c, _ in scored])}
        if ngram:
            row.update(nll_calibrated_ngram=sum(v[2] for v in values) / len(values),
                       ece_calibrated_ngram=calibration_error([(r, c) for r, _, c in scored]))
        reliability.append(row)
    return rows, reliability, plain + (boosted if ngram else [])
