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

Optionally (`etas`, fitted by `fit_ngram`) the rows also carry the context n-gram expert of `ngram.py`:
p~(t|u) ∝ exp(beta_d z_u[t] + sum_{i <= level(u, t)} eta_i), eta_i >= 0 shared by all depths. The NLL
stays convex in (beta, eta); the fit alternates an exact per-depth grid search over beta with a
projected Newton step in eta. A file without etas is the plain per-depth temperature (old files load
as before).
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
    """Inverse temperatures per node depth (0 = the root's row; deeper rows use the last one) and the
    context n-gram boosts per level (`ngram.py`; none: no expert)."""

    betas: tuple[float, ...]
    etas: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.betas or min(self.betas) <= 0:
            raise ValueError(f"calibration betas must be a non-empty list of positive numbers, got {list(self.betas)}")
        if self.etas and min(self.etas) < 0:
            raise ValueError(f"calibration etas (n-gram boosts) must be >= 0, got {list(self.etas)}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        object.__setattr__(self, "etas", tuple(float(e) for e in self.etas))

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
        return cls(_per_depth_argmin(depth, row_nll(label_logit, lse, grid), grid, min_rows))

    @classmethod
    def fit_ngram(cls, depth: Tensor, label_logit: Tensor, lse: Tensor, label_level: Tensor, cand_logit: Tensor,
                  cand_level: Tensor, levels: int, grid: Tensor = GRID, min_rows: int = 32,
                  sweeps: int = 4) -> "RowTemperature":
        """Maximum likelihood of per-depth betas and n-gram etas [levels] over visited rows: as `fit`,
        plus the level of each row's label [M] (0: not in the context) and each row's continuations'
        raw logits and levels [M, C] (level 0: padding)."""
        if depth.numel() == 0:
            raise ValueError("no recorded rows to fit a calibration on")
        g = grid.to(lse)
        cal = cls.fit(depth, label_logit, lse, grid, min_rows)
        etas = torch.zeros(levels, dtype=torch.float64)
        for _ in range(sweeps):
            col = (torch.tensor(cal.betas, dtype=torch.float64)[depth.clamp(max=len(cal.betas) - 1)][:, None]
                   == g[None, :]).long().argmax(dim=1)  # [M]
            beta, l_col = g[col], lse.gather(1, col[:, None])[:, 0]
            etas = _newton_etas(lambda e: ngram_nll(beta[:, None], l_col[:, None], label_logit, label_level,
                                                     cand_logit, cand_level, e).sum(), etas)
            nll = ngram_nll(g[None, :], lse, label_logit, label_level, cand_logit, cand_level, etas)  # [M, G]
            cal = cls(_per_depth_argmin(depth, nll, grid, min_rows), tuple(etas.tolist()))
        return cal

    def save(self, path: str | Path) -> None:
        data = {"kind": "per-depth temperature", "betas": list(self.betas)}
        if self.etas:
            data = {"kind": "per-depth temperature + context n-grams", "betas": list(self.betas), "etas": list(self.etas)}
        Path(path).write_text(json.dumps(data) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "RowTemperature":
        try:
            data = json.loads(Path(path).read_text())
            return cls(tuple(data["betas"]), tuple(data.get("etas", ())))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"calibration={str(path)!r} is not a calibration file written by "
                             f"scripts/foresight_hits.py (OUT/calibration.json or OUT/calibration_ngram.json of its --out) "
                             f"({type(exc).__name__}: {exc})") from None


def _per_depth_argmin(depth: Tensor, nll: Tensor, grid: Tensor, min_rows: int) -> tuple[float, ...]:
    """Per depth, the grid value of least summed NLL [M, G] over that depth's rows (pooled as the
    module docstring says)."""
    betas = []
    for d in range(int(depth.max()) + 1):
        rows = depth == d
        if int(rows.sum()) < min_rows:
            rows = depth >= d
        if int(rows.sum()) < min_rows:
            rows = torch.ones_like(rows)
        betas.append(float(grid[nll[rows].sum(dim=0).argmin()]))
    return tuple(betas)


def ngram_nll(beta: Tensor, lse: Tensor, label_logit: Tensor, label_level: Tensor, cand_logit: Tensor,
               cand_level: Tensor, etas: Tensor) -> Tensor:
    """[M, G]: -log p~(label) of M rows at inverse temperatures beta [M or 1, G] (lse [M, G] their
    log-partitions without the expert) and boosts etas [o]."""
    table = torch.cat([etas.new_zeros(1), etas.cumsum(0)])
    b_label = table[label_level.clamp(max=etas.shape[0])]  # [M]
    b_cand = table[cand_level.clamp(max=etas.shape[0])]  # [M, C]
    extra = torch.exp(beta[:, :, None] * cand_logit[:, None, :] - lse[:, :, None]) * torch.expm1(b_cand)[:, None, :]
    log_z = lse + torch.log1p(torch.where(cand_level[:, None, :] > 0, extra, 0.0).sum(dim=-1))
    return log_z - beta * label_logit[:, None] - b_label[:, None]


def _newton_etas(f, etas: Tensor, steps: int = 50, tol: float = 1e-10) -> Tensor:  # type: ignore[no-untyped-def]
    """argmin of a convex smooth f over etas >= 0: Newton steps on the free coordinates, projected,
    with backtracking."""
    with torch.enable_grad():  # callers may run under no_grad
        return _newton(f, etas.clone(), steps, tol)


def _newton(f, x: Tensor, steps: int, tol: float) -> Tensor:  # type: ignore[no-untyped-def]
    fx = float(f(x))
    for _ in range(steps):
        grad = torch.autograd.functional.jacobian(f, x)
        hess = torch.autograd.functional.hessian(f, x)
        free = (x > 0) | (grad < 0)  # coordinates at the bound with a pushing gradient stay there
        if not bool(free.any()):
            break
        step = torch.zeros_like(x)
        h = hess[free][:, free] + 1e-9 * torch.eye(int(free.sum()), dtype=x.dtype)
        step[free] = torch.linalg.solve(h, grad[free])
        t = 1.0
        while t > 1e-6:
            y = (x - t * step).clamp(min=0)
            fy = float(f(y))
            if fy <= fx:
                break
            t /= 2
        if fx - fy < tol:
            x, fx = (y, fy) if fy <= fx else (x, fx)
            break
        x, fx = y, fy
    return x
