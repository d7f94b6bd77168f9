"""Training curves of a run directory (its `train_log.jsonl`): one PNG per head and a text summary that
says whether the validation loss has flattened.

Per head: loss against response tokens trained on (training loss raw and smoothed, validation loss),
top-1 agreement (training and validation), and validation tau by exact replay per budget; snapshot
points are marked. Throughput (tokens/s through the target, median of the log records) is in the title.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from specbench.train.trainer import LOG_FILE, tokens_label


def read_log(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / LOG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist: is {str(run_dir)!r} a `specbench train --out` directory?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def head_labels(rows: list[dict[str, Any]]) -> list[str]:
    """Labels that have training records ("<label>/loss")."""
    out: dict[str, None] = {}
    for r in rows:
        if "kind" not in r:
            for key in r:
                if key.endswith("/loss") and not key.startswith("val/"):
                    out.setdefault(key[: -len("/loss")], None)
    return list(out)


def _ema(values: list[float], alpha: float = 0.1) -> list[float]:
    out, acc = [], None
    for v in values:
        acc = v if acc is None else (1 - alpha) * acc + alpha * v
        out.append(acc)
    return out


def _x(r: dict[str, Any]) -> float:
    return float(r.get("tokens", r["step"]))


def summarize(rows: list[dict[str, Any]], flat_frac: float = 1 / 3, flat_tol: float = 0.01) -> list[dict[str, Any]]:
    """Per head: steps, tokens, recent training loss, last validation figures, and the relative change
    of the validation loss over the last `flat_frac` of the tokens (flat when above -flat_tol)."""
    train = [r for r in rows if "kind" not in r]
    vals = [r for r in rows if r.get("kind") == "val"]
    speeds = [r["tok_s"] for r in train if r.get("tok_s")]  # sequence tokens (prompt + response) a second
    out = []
    for label in head_labels(rows):
        mine = [r for r in train if f"{label}/loss" in r]
        last = mine[-5:]
        item: dict[str, Any] = {"head": label, "step": mine[-1]["step"] if mine else 0,
                                "tokens": int(mine[-1].get("tokens", 0)) if mine else 0,
                                "train_loss": statistics.fmean(r[f"{label}/loss"] for r in last) if last else float("nan"),
                                "tok_s": statistics.median(speeds) if speeds else float("nan")}
        v = [r for r in vals if f"val/{label}/loss" in r]
        if v:
            prefix = f"val/{label}/"
            for r in v:  # each metric from the latest record that has it (tau is scored less often)
                item.update({"val_" + k[len(prefix):]: val for k, val in r.items() if k.startswith(prefix)})
            end = _x(v[-1])
            start = [r for r in v if _x(r) <= end - flat_frac * (end - _x(v[0]))]
            if start and _x(v[-1]) > _x(start[-1]):
                before, after = start[-1][f"val/{label}/loss"], v[-1][f"val/{label}/loss"]
                item["val_loss_change"] = after / before - 1.0
                item["flat"] = item["val_loss_change"] > -flat_tol
        out.append(item)
    return out


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None, compact: bool = False) -> list[Path]:
    """<out_dir or run_dir/plots>/<label>.png for every head of the run; `compact`: 70 dpi and a 48-colour
    palette, about a quarter of the bytes (copies kept in git)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_log(run_dir)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    train = [r for r in rows if "kind" not in r]
    vals = [r for r in rows if r.get("kind") == "val"]
    snaps = [r for r in rows if r.get("kind") == "snapshot"]
    speeds = [r["tok_s"] for r in train if r.get("tok_s")]  # sequence tokens (prompt + response) a second
    resp_speeds = [r["resp_tok_s"] for r in train if r.get("resp_tok_s")]
    paths = []
    for label in head_labels(rows):
        mine = [r for r in train if f"{label}/loss" in r]
        mv = [r for r in vals if f"val/{label}/loss" in r]
        fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
        x = [_x(r) for r in mine]
        loss = [r[f"{label}/loss"] for r in mine]
        axes[0].plot(x, loss, color="C0", alpha=0.25, linewidth=0.8)
        axes[0].plot(x, _ema(loss), color="C0", label="train (EMA)")
        if mv:
            axes[0].plot([_x(r) for r in mv], [r[f"val/{label}/loss"] for r in mv], "o-", color="C3", label="validation")
        axes[0].set_ylabel("loss")
        acc = [(r_x, r[f"{label}/acc"]) for r_x, r in zip(x, mine) if f"{label}/acc" in r]
        if acc:
            axes[1].plot([a for a, _ in acc], _ema([b for _, b in acc]), color="C0", label="train (EMA)")
        for key, style in (("acc", "o-"), ("acc_next", "s--")):
            pts = [(_x(r), r[f"val/{label}/{key}"]) for r in mv if f"val/{label}/{key}" in r]
            if pts:
                axes[1].plot([a for a, _ in pts], [b for _, b in pts], style, color="C3", label=f"validation {key}")
        axes[1].set_ylabel("top-1 agreement with the target")
        budgets = sorted({int(k.rsplit("tau", 1)[1]) for r in mv for k in r if k.startswith(f"val/{label}/tau")})
        for i, b in enumerate(budgets):
            pts = [(_x(r), r[f"val/{label}/tau{b}"]) for r in mv if f"val/{label}/tau{b}" in r]
            axes[2].plot([a for a, _ in pts], [v for _, v in pts], "o-", color=f"C{i}", label=f"budget {b}")
        axes[2].set_ylabel("validation tau (exact replay)")
        if not budgets:  # a run with --val-tau-every 0 scores no tau: say so rather than draw empty axes
            axes[2].text(0.5, 0.5, "no validation tau in this run\n(--val-tau-every 0)", ha="center", va="center",
                         transform=axes[2].transAxes, color="grey")
        for ax in axes:
            for s in snaps:
                ax.axvline(s["tokens"], color="grey", linestyle=":", linewidth=0.8)
            ax.set_xlabel("response tokens trained on")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        speed = f", median {statistics.median(speeds):,.0f} sequence tok/s" if speeds else ""
        if resp_speeds:
            speed += f" ({statistics.median(resp_speeds):,.0f} response)"
        tokens = tokens_label(int(mine[-1].get("tokens", 0))) if mine else "0"
        fig.suptitle(f"{label}: step {mine[-1]['step'] if mine else 0}, {tokens} response tokens{speed}")
        fig.tight_layout()
        path = out / f"{label}.png"
        fig.savefig(path, dpi=70 if compact else 110)
        plt.close(fig)
        if compact:
            save_palette_png(path)
        paths.append(path)
    return paths


def save_palette_png(path: Path, colours: int = 48) -> None:
    """Rewrite a plot's PNG with a small palette (plots have few colours; Pillow comes with matplotlib)."""
    from PIL import Image

    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=colours, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def format_summary(items: list[dict[str, Any]]) -> str:
    lines = [f"{'head':<24}{'step':>8}{'tokens':>9}{'train':>8}{'val':>8}{'val acc':>8}{'tau':>16}{'val Δ':>8}  flat"]
    for it in items:
        taus = " ".join(f"{it[k]:.2f}" for k in sorted((k for k in it if k.startswith("val_tau")),
                                                        key=lambda k: int(k[len("val_tau"):])))
        change = it.get("val_loss_change")
        lines.append(f"{it['head']:<24}{it['step']:>8}{tokens_label(it['tokens']):>9}{it['train_loss']:>8.3f}"
                     f"{it.get('val_loss', float('nan')):>8.3f}{it.get('val_acc', float('nan')):>8.3f}{taus:>16}"
                     f"{'' if change is None else f'{100 * change:+.1f}%':>8}  {it.get('flat', '')}")
    return "\n".join(lines)
