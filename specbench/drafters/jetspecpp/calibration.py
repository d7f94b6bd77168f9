"""Calibrating the decoder's rows before foresight scores outcomes (the paper's App. B.1 is not
public, so this is our choice).

What: per-depth temperature scaling of the training-free decoder's logits, p~(.|u) = softmax(beta_d z_u)
with d = depth(u), fitted by maximum likelihood of the verified outcomes of recorded rounds; outcome
scores are then P~(u, a) over the scaled rows (`selection.py`).

Why this form:
* The outcome law factorises over the rows the walk visits: log P~(verified outcome) = the sum over
  visited rows of log p~(label | row), the labels being the next path token and, at the last row,
  the bonus. Maximising it is a per-row likelihood fit (a proper scoring rule of the outcome law
  itself) that splits by depth.
* Scaling rows, not scores: a monotone map of the outcome score (Platt, isotonic) never changes the
  top-B set, only what a threshold λ means, while Table 11 separates calibrated from uncalibrated
  top-B, so the paper's calibration changes the ranking. Per-depth temperatures do: a decoder that is
  overconfident at deep rows (reading a weak adapter's states) overrates long acceptances, and
  beta_d < 1 there moves mass back to early stops.
* P~ stays a distribution over outcomes (it sums to 1), so λ keeps its meaning as a probability, and
  one parameter per depth fits on a few hundred rounds.
* The negative log-likelihood is convex in beta (a logsumexp of a linear function minus a linear
  term), so a search over `GRID` finds the optimum up to the grid's step; a recorded round keeps the
  logsumexp of every row at every grid value (`selection.RowStats`), so fitting needs no logits.
Depths with fewer than `min_rows` visited rows pool the rows at that depth and deeper (deep rows are
rare: the walk has to get there), and with still too few, all rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

GRID = 2.0 ** (torch.arange(-32, 33, dtype=torch.float64) / 8)  # 1/16 .. 16 in steps of 2^(1/8); 1.0 is on it


def row_nll(label_logit: Tensor, lse: Tensor, grid: Tensor = GRID) -> Tensor:
    """[M, G]: -log softmax(beta_g z)[label] of M rows from their labels' raw logits [M] and their
    log-partitions lse [M, G] at the grid's inverse temperatures."""
    return lse - grid.to(lse)[None, :] * label_logit.to(lse)[:, None]


@dataclass(frozen=True)
class RowTemperature:
    """Inverse temperatures per node depth (0 = the root's row); deeper rows use the last one."""

    betas: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.betas or min(self.betas) <= 0:
            raise ValueError(f"calibration betas must be a non-empty list of positive numbers, got {list(self.betas)}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))

    @staticmethod
    def identity() -> "RowTemperature":
        return RowTemperature((1.0,))

    def beta(self, depth: Tensor) -> Tensor:
        """[N] float64 inverse temperatures of rows at `depth` [N]."""
        table = torch.tensor(self.betas, dtype=torch.float64, device=depth.device)
        return table[depth.clamp(max=len(self.betas) - 1)]

    @classmethod
    def fit(cls, depth: Tensor, label_logit: Tensor, lse: Tensor, grid: Tensor = GRID,
            min_rows: int = 32) -> "RowTemperature":
        """Maximum likelihood per depth over visited rows: depth [M], their labels' raw logits [M],
        log-partitions lse [M, G] at `grid`."""
        if depth.numel() == 0:
            raise ValueError("no recorded rows to fit a calibration on")
        nll = row_nll(label_logit, lse, grid)  # [M, G]
        betas = []
        for d in range(int(depth.max()) + 1):
            rows = depth == d
            if int(rows.sum()) < min_rows:
                rows = depth >= d
            if int(rows.sum()) < min_rows:
                rows = torch.ones_like(rows)
            betas.append(float(grid[nll[rows].sum(dim=0).argmin()]))
        return cls(tuple(betas))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"kind": "per-depth temperature", "betas": list(self.betas)}) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "RowTemperature":
        try:
            data = json.loads(Path(path).read_text())
            return cls(tuple(data["betas"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"calibration={str(path)!r} is not a calibration file written by "
                             f"scripts/foresight_hits.py --fit-out ({type(exc).__name__}: {exc})") from None
