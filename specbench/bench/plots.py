"""`specbench plot`: PNGs of a results file (matplotlib, Agg backend, no display needed).

tau_vs_budget.png   mean tau against the budget, one line per drafter/tree, one panel per dataset
                    (when no drafter/tree was run at two budgets or more, tau.png instead: bars per
                    configuration, as speedup.png; a line through one budget is a dot)
speedup.png         decode-only speed-up over AR (mean ± std over prompts) per configuration and dataset
accept_by_depth.png P(at least k draft tokens accepted) against k, rounds pooled over prompts
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import pandas as pd  # noqa: E402

from specbench.bench.store import ResultsError  # noqa: E402
from specbench.bench.table import load_frame  # noqa: E402


def config_label(row: pd.Series) -> str:
    return f"{row['drafter']}/{row['tree']}/b{row['budget']}"


def plot_tau_vs_budget(sd: pd.DataFrame, path: Path) -> None:
    datasets = sorted(sd["dataset"].unique())
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.6), squeeze=False, sharey=True)
    for ax, dataset in zip(axes[0], datasets):
        part = sd[sd["dataset"] == dataset]
        for (drafter, tree), g in part.groupby(["drafter", "tree"], sort=True):
            mean = g.groupby("budget")["tau"].mean().sort_index()
            ax.plot(mean.index, mean.values, marker="o", label=f"{drafter}/{tree}")
        ax.set_xscale("log", base=2)
        ax.set_title(dataset)
        ax.set_xlabel("budget (draft nodes)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("tau (tokens / verify pass)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def several_budgets(sd: pd.DataFrame) -> bool:
    """Whether some drafter/tree was run at two budgets or more on one dataset (a line to draw)."""
    return bool((sd.groupby(["dataset", "drafter", "tree"])["budget"].nunique() > 1).any())


def plot_tau(sd: pd.DataFrame, path: Path) -> None:
    plot_bars(sd, "tau", "tau (tokens / verify pass)", path, reference=None)


def plot_speedup(sd: pd.DataFrame, path: Path) -> None:
    plot_bars(sd, "speedup_decode", "speed-up over AR (decode only)", path, reference=1.0)


def plot_bars(sd: pd.DataFrame, value: str, ylabel: str, path: Path, reference: float | None) -> None:
    """Mean ± std over prompts of `value`, one bar per configuration and dataset."""
    sd = sd.assign(config=sd.apply(config_label, axis=1))
    stats = sd.groupby(["config", "dataset"])[value].agg(["mean", "std"]).unstack("dataset")
    configs, datasets = list(stats.index), list(stats["mean"].columns)
    x = np.arange(len(configs))
    width = 0.8 / max(len(datasets), 1)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(configs) + 2), 3.8))
    for i, dataset in enumerate(datasets):
        ax.bar(x + i * width, stats["mean"][dataset].to_numpy(), width, yerr=stats["std"][dataset].fillna(0).to_numpy(),
               capsize=2, label=dataset)
    if reference is not None:
        ax.axhline(reference, color="black", linewidth=0.8)
    ax.set_xticks(x + width * (len(datasets) - 1) / 2)
    ax.set_xticklabels(configs, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_accept_by_depth(sd: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    sd = sd.assign(config=sd.apply(config_label, axis=1))
    for config, g in sd.groupby("config", sort=True):
        pooled: dict[int, int] = {}
        for hist in g["accepted_hist"]:
            for accepted, count in hist.items():
                pooled[accepted] = pooled.get(accepted, 0) + count
        rounds = sum(pooled.values())
        depth = max(pooled, default=0)
        if rounds == 0 or depth == 0:
            continue
        ks = np.arange(1, depth + 1)
        at_least = [sum(c for a, c in pooled.items() if a >= k) / rounds for k in ks]
        ax.plot(ks, at_least, marker=".", label=config)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("depth k")
    ax.set_ylabel("P(accepted ≥ k)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def make_plots(paths: Iterable[str | Path], out_dir: str | Path, where: tuple[str, ...] = ()) -> list[Path]:
    """Write the PNGs into `out_dir`; returns their paths."""
    df = load_frame(paths, where)
    sd = df[df["drafter"] != "ar"]
    if sd.empty:
        raise ResultsError("the results hold only AR rows: nothing to plot against the baseline")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    tau = ("tau_vs_budget.png", plot_tau_vs_budget) if several_budgets(sd) else ("tau.png", plot_tau)
    timed = ("speedup.png", plot_speedup) if "speedup_decode" in sd.columns else None  # replay rows: tau only
    for name, plot in (p for p in (tau, timed, ("accept_by_depth.png", plot_accept_by_depth)) if p is not None):
        plot(sd, out / name)
        written.append(out / name)
    return written
