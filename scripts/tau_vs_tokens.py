"""tau against training tokens: every snapshot of a training run (the heads exported when the run had
trained on --snapshot-tokens response tokens, e.g. 0.4M and 2M) and its final heads, replayed exactly
(scripts/tau_table.py, T = 0, fp32) on GSM8K and MATH-500 at budgets 16/64/256 (parallel heads under
ddtree, eagle3 under eagle2), then one table per dataset and a plot: does more data still help?

    python scripts/tau_vs_tokens.py --run RUN --data ../shared/data --out RUN/tau_tokens.jsonl [--n 50]   # run / resume
    python scripts/tau_vs_tokens.py --run RUN --out RUN/tau_tokens.jsonl --table-only --plot tau_tokens.png

Heads are labelled <head>@<tokens> (the snapshot's milestone; the final heads get the run's token count).
Tables made separately (e.g. by tau_table.py for heads of different runs or sessions) join the same way,
on the prompts every table has (paired):

    python scripts/tau_vs_tokens.py --tables 0.41M=A.jsonl.gz,4.95M=B.jsonl.gz,9.84M=C.jsonl --plot tau_tokens.png

Options after the known ones go to tau_table.py as they are (e.g. --device cuda --parallel 8 --minutes 8
--ref-batch 4); the rows file resumes like tau_table's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
from tau_table import read_rows  # noqa: E402

from specbench.train.curves import save_palette_png  # noqa: E402
from specbench.train.trainer import tokens_label  # noqa: E402


def checkpoints(run: Path, include_final: bool) -> list[tuple[str, int, Path]]:
    """(tokens label, response tokens trained on, directory of <head>/ folders), in token order."""
    out = []
    for meta in sorted((run / "snapshots").glob("tok*/snapshot.json")):
        m = json.loads(meta.read_text())
        out.append((m["label"], int(m["tokens_seen"]), meta.parent))
    if include_final and (run / "heads").is_dir() and (run / "run.json").is_file():
        seen = int(json.loads((run / "run.json").read_text())["tokens_seen"])
        if not out or seen > out[-1][1]:
            out.append((tokens_label(seen), seen, run / "heads"))
    if not out:
        raise SystemExit(f"tau_vs_tokens: {str(run)!r} has no snapshots/ and no final heads: train with --snapshot-tokens")
    return out


def heads_arg(points: list[tuple[str, int, Path]], heads: list[str] | None) -> str:
    items = []
    for label, _, d in points:
        for head in sorted(p.name for p in d.iterdir() if (p / "config.json").is_file()):
            if heads is None or head in heads:
                items.append(f"{head}@{label}={d / head}")
    return ",".join(items)


def joined_tables(spec: str) -> tuple[list[dict], list[tuple[str, int, Path]]]:
    """--tables TOKENS=FILE,...: each file's head rows relabelled <head>@<tokens>, kept only on the (dataset,
    item) pairs present in every file, so the columns compare the same prompts; heads without weights
    (ngram, self) are left out, being the same at any token count."""
    from specbench.train.cli import parse_token_count

    tables = []
    for item in spec.split(","):
        label, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"--tables takes TOKENS=FILE items (e.g. 2M=tau.jsonl), got {item!r}")
        tables.append((label.strip(), parse_token_count(label.strip()), read_rows(Path(path))))
    tables.sort(key=lambda t: t[1])
    common = set.intersection(*({(r["dataset"], str(r["id"])) for r in rows} for _, _, rows in tables))
    out = {(label, r["dataset"], str(r["id"]), r["drafter"], r["tree"], r["budget"]): {**r, "drafter": f"{r['drafter']}@{label}"}
           for label, _, rows in tables for r in rows
           if (r["dataset"], str(r["id"])) in common and r["drafter"] not in ("ngram", "self")}  # a row once
    return list(out.values()), [(label, seen, Path(".")) for label, seen, _ in tables]


def table(rows: list[dict], points: list[tuple[str, int, Path]]) -> str:
    import pandas as pd

    if not rows:
        return "no rows yet"
    df = pd.DataFrame(rows)
    df[["head", "tokens"]] = df["drafter"].str.rsplit("@", n=1, expand=True)
    order = [label for label, _, _ in points]
    df["config"] = df["head"] + "/" + df["tree"] + "/" + df["budget"].astype(str)
    parts = []
    for ds, g in df.groupby("dataset"):
        t = g.pivot_table(index="config", columns="tokens", values="tau", aggfunc="mean")
        n = g.pivot_table(index="config", columns="tokens", values="tau", aggfunc="count")
        t = t[[c for c in order if c in t.columns]]
        keys = sorted(t.index, key=lambda c: (c.split("/")[0], c.split("/")[1], int(c.split("/")[2])))
        parts.append(f"{ds} (mean tau; prompts per cell {int(n.min().min())}-{int(n.max().max())}; columns: response "
                     f"tokens trained on)\n{t.loc[keys].round(3).to_string()}")
    return "\n\n".join(parts)


def plot(rows: list[dict], points: list[tuple[str, int, Path]], path: Path, dpi: int = 80,
         only_budgets: list[int] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.DataFrame(rows)
    df[["head", "tokens"]] = df["drafter"].str.rsplit("@", n=1, expand=True)
    x_of = {label: seen for label, seen, _ in points}
    datasets = sorted(df["dataset"].unique())
    budgets = [b for b in sorted(df["budget"].unique()) if not only_budgets or b in only_budgets]
    fig, axes = plt.subplots(len(datasets), len(budgets), figsize=(4.2 * len(budgets), 3.4 * len(datasets)),
                             squeeze=False, sharey="row")
    for i, ds in enumerate(datasets):
        for j, b in enumerate(budgets):
            ax = axes[i][j]
            part = df[(df["dataset"] == ds) & (df["budget"] == b)]
            for (head, tree), g in part.groupby(["head", "tree"]):
                mean = g.groupby("tokens")["tau"].mean()
                xs = sorted(mean.index, key=lambda t: x_of.get(t, 0))
                ax.plot([x_of.get(t, 0) for t in xs], [mean[t] for t in xs], "o-", label=f"{head}/{tree}")
            ax.set_xscale("log")
            ax.set_title(f"{ds}, budget {b}")
            ax.set_xlabel("response tokens trained on")
            ax.grid(alpha=0.3)
        axes[i][0].set_ylabel("tau (exact replay, T = 0)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    save_palette_png(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="a `specbench train --out` directory with snapshots/")
    p.add_argument("--out", help="rows (JSONL, resumable)")
    p.add_argument("--tables", default=None, metavar="TOKENS=FILE,...",
                   help="instead of --run: tau tables of heads at these training-token counts, joined on common prompts")
    p.add_argument("--data", default=None)
    p.add_argument("--datasets", default="gsm8k,math500")
    p.add_argument("--n", type=int, default=50, help="items per dataset")
    p.add_argument("--budgets", default="16,64,256")
    p.add_argument("--trees", default="ddtree,eagle2")
    p.add_argument("--heads", default=None, help="only these heads (comma-separated labels of the run)")
    p.add_argument("--no-final", action="store_true", help="leave out the run's final heads")
    p.add_argument("--table-only", action="store_true")
    p.add_argument("--plot", default=None, help="write the curves to this PNG")
    p.add_argument("--plot-budgets", default=None, help="only these budgets in the plot, e.g. 64")
    args, passthrough = p.parse_known_args()
    budgets = [int(b) for b in args.plot_budgets.split(",")] if args.plot_budgets else None
    if args.tables:
        rows, points = joined_tables(args.tables)
        print(table(rows, points))
        if args.plot and rows:
            plot(rows, points, Path(args.plot), only_budgets=budgets)
        return 0
    if not args.run or not args.out:
        p.error("give --run RUN --out FILE (or --tables)")
    run, out = Path(args.run), Path(args.out)
    points = checkpoints(run, include_final=not args.no_final)
    code = 0
    if not args.table_only:
        wanted = args.heads.split(",") if args.heads else None
        cmd = [sys.executable, str(SCRIPTS / "tau_table.py"), "--out", str(out), "--heads", heads_arg(points, wanted),
               "--datasets", args.datasets, "--n", str(args.n), "--budgets", args.budgets, "--trees", args.trees,
               *(["--data", args.data] if args.data else []), *passthrough]
        code = subprocess.run(cmd).returncode
    rows = read_rows(out)
    print(table(rows, points))
    if args.plot and rows:
        plot(rows, points, Path(args.plot), only_budgets=budgets)
        print(f"tau_vs_tokens: {args.plot}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
