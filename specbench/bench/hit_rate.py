"""Offline hit rate of foresight's selection rules on recorded rounds (JetSpec++ Tables 10 and 11).

A `RoundRecord` (`specbench.drafters.jetspecpp.speculation`) keeps one verified block: the tree, the
decoder's rows (`RowStats` on the calibration grid), the draft model's own rows and the verified
outcome. A rule hits on a round when the verified outcome is among the B outcomes it selects. The
rules are Table 11's rows:

  calibrated    top-B of P̂ over the decoder's rows at fitted per-depth temperatures (the served rule)
  uncalibrated  top-B of P̂ over the raw decoder rows
  threshold     calibrated score >= λ, at most B (reported with the mean number selected)
  draft         top-B of the outcome law of the draft model's own per-depth rows
  ssd           SSD-style geometric fan-out over the draft's rows (no decoder anchors)
  ssd-decoder   the same fan-out over the decoder's rows (decoder anchors)

Calibration is cross-fitted: prompts are split into folds, and each fold's rounds are scored with
temperatures fitted on the other folds' rounds, so no hit rate is measured on rounds its calibration
saw. Reliability of the scores: the mean negative log-likelihood of the verified outcome (nats per
round) and the expected calibration error of the top-B outcomes' scores (binned score against how
often that outcome was the verified one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from specbench.drafters.jetspecpp.calibration import GRID, RowTemperature, row_nll
from specbench.drafters.jetspecpp.selection import RowLaw, Selection, select
from specbench.drafters.jetspecpp.speculation import RoundRecord

RULE_NAMES = ("calibrated", "uncalibrated", "threshold", "draft", "ssd", "ssd-decoder")


@dataclass(frozen=True)
class RuleSpec:
    """How a rule name maps onto `selection.select`: the rule, whose rows, calibrated or not."""

    select: str
    rows: str  # decoder | draft
    calibrated: bool


RULES = {
    "calibrated": RuleSpec("top", "decoder", True),
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
    """The record's decoder rows at the calibration's per-depth temperatures (raw when None)."""
    depth = torch.tensor(rec.depth)
    beta = (cal or RowTemperature.identity()).beta(depth)
    return rec.decoder.law(rec.decoder.column_of(_on_grid(beta)), torch.tensor(rec.parents))


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


def fit_calibration(records: Sequence[RoundRecord], min_rows: int = 32) -> RowTemperature:
    rows = [visited_rows(r) for r in records]
    return RowTemperature.fit(torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows]),
                              torch.cat([r[2] for r in rows]), GRID, min_rows=min_rows)


def outcome_nll(rec: RoundRecord, cal: RowTemperature | None) -> float:
    """-log P~(verified outcome) in nats: the visited rows' NLL at their depths' temperatures."""
    depth, label, lse = visited_rows(rec)
    beta = _on_grid((cal or RowTemperature.identity()).beta(depth))
    col = (beta[:, None] == GRID.to(beta)[None, :]).long().argmax(dim=1)
    return float(row_nll(label, lse).gather(1, col[:, None]).sum())


def calibration_error(scored: Sequence[tuple[RoundRecord, RowTemperature | None]], B: int = 16, bins: int = 10) -> float:
    """Expected calibration error of the top-B outcomes' scores (probability bins of equal width) over
    rounds each scored with its own calibration (None: raw rows)."""
    scores, hits = [], []
    for rec, cal in scored:
        sel = selection(rec, "calibrated" if cal is not None else "uncalibrated", B, cal)
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
             rules: Sequence[str] = RULE_NAMES, lam: float = 0.01, ratio: float = 0.5, folds: int = 2,
             min_rows: int = 32) -> tuple[list[dict], list[dict], list[RowTemperature]]:
    """Hit rates per (dataset, rule, B) over `prompts` = [(dataset, rounds)], the calibration
    cross-fitted over `folds` folds of prompts; reliability rows per dataset; the fitted calibrations."""
    bad = [r for r in rules if r not in RULES]
    if bad:
        raise ValueError(f"unknown rules {bad}; choose from {list(RULES)}")
    fold_of = [i % folds for i in range(len(prompts))]
    cals = []
    for f in range(folds):
        train = [r for (_, rounds), g in zip(prompts, fold_of) if g != f for r in rounds]
        cals.append(fit_calibration(train, min_rows) if train else RowTemperature.identity())
    counts: dict[tuple[str, str, int], list[float]] = {}
    nll: dict[str, list[tuple[float, float]]] = {}
    by_dataset: dict[str, list[tuple[RoundRecord, RowTemperature]]] = {}
    for (dataset, rounds), g in zip(prompts, fold_of):
        cal = cals[g]
        for rec in rounds:
            by_dataset.setdefault(dataset, []).append((rec, cal))
            nll.setdefault(dataset, []).append((outcome_nll(rec, None), outcome_nll(rec, cal)))
            for rule in rules:
                for B in Bs:
                    sel = selection(rec, rule, B, cal if RULES[rule].calibrated else None, lam=lam, ratio=ratio)
                    c = counts.setdefault((dataset, rule, B), [0.0, 0.0, 0.0])
                    c[0] += hit(rec, sel)
                    c[1] += 1
                    c[2] += float(sel.valid.sum())
    rows = [{"dataset": d, "rule": rule, "B": B, "hit_rate": c[0] / c[1], "rounds": int(c[1]), "mean_selected": c[2] / c[1]}
            for (d, rule, B), c in counts.items()]
    reliability = []
    for d, pairs in nll.items():
        scored = by_dataset[d]
        reliability.append({
            "dataset": d, "rounds": len(pairs),
            "nll_uncalibrated": sum(a for a, _ in pairs) / len(pairs), "nll_calibrated": sum(b for _, b in pairs) / len(pairs),
            "ece_uncalibrated": calibration_error([(r, None) for r, _ in scored]),
            "ece_calibrated": calibration_error(scored)})
    return rows, reliability, cals
