"""Results rows -> a pandas frame with per-prompt speed-ups -> pivot tables (markdown, LaTeX, CSV).

Speed-up is per prompt against the AR row of the same target, stack, sampling, length, item and turn
(written by the same run): `speedup_decode` = AR decode time per token / SD decode time per token
(prefill excluded); `speedup_e2e` = the same with prefill included. Cells are means over prompts with
their spread (std by default).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Collection, Iterable, Sequence

import pandas as pd

from specbench.bench.store import ResultsError, read_many

FORMATS = ("markdown", "latex", "csv")
SPREADS = ("std", "sem", "none")
SPEEDUP_LEGEND = ("speedup_decode = AR decode time/token / SD decode time/token (prefill excluded), per prompt, "
                  "same target and stack, same run; speedup_e2e = the same with prefill included")


def results_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per result: scalar fields, stage_<name>_s columns (and <name>_ms per round, round_ms,
    overhead_frac = the non-forward share of a round), and the speed-up columns."""
    if not rows:
        raise ResultsError("the results hold no rows yet: run the study first (`specbench run STUDY.py`)")
    records = []
    for r in rows:
        rec = {k: v for k, v in r.items() if not isinstance(v, (dict, list))}
        for stage, seconds in (r.get("stage_s") or {}).items():
            rec[f"stage_{stage}_s"] = seconds
        rec["accepted_hist"] = {int(k): int(v) for k, v in (r.get("accepted_hist") or {}).items()}
        records.append(rec)
    df = pd.DataFrame.from_records(records)
    rounds = df["rounds"].where(df["rounds"] > 0) if "rounds" in df.columns else None
    if rounds is not None:  # per-round stage times (ms) and the share of the round spent outside the forward
        stages = [c[len("stage_"):-2] for c in df.columns if c.startswith("stage_") and c.endswith("_s")]
        for stage in stages:
            df[f"{stage}_ms"] = 1e3 * df[f"stage_{stage}_s"].fillna(0.0) / rounds
        if stages:
            df["round_ms"] = sum(df[f"{stage}_ms"] for stage in stages)
            if "verify_forward_ms" in df.columns:
                df["overhead_frac"] = (df["round_ms"] - df["verify_forward_ms"]) / df["round_ms"].where(df["round_ms"] > 0)
    if "baseline_key" not in df.columns:  # replay rows only: tau, no timings of the decode loop
        return df
    ar = df[df["drafter"] == "ar"].set_index("key")
    base_decode = df["baseline_key"].map(ar["decode_tok_s"])
    base_e2e = df["baseline_key"].map(ar["e2e_tok_s"])
    df["ar_decode_tok_s"] = base_decode
    df["speedup_decode"] = _ratio(df["decode_tok_s"], base_decode)
    df["speedup_e2e"] = _ratio(df["e2e_tok_s"], base_e2e)
    return df


def _ratio(num: pd.Series, den: pd.Series) -> pd.Series:
    ok = (num > 0) & (den > 0)
    return (num / den).where(ok)


def load_frame(paths: Iterable[str | Path], where: Sequence[str] = (), keys: Collection[str] | None = None) -> pd.DataFrame:
    """Frame of one or more results files/run directories, filtered by `key=value[,value...]` clauses
    and, when given, restricted to the row keys `keys` (e.g. those of one study)."""
    rows = read_many(paths)
    df = results_frame(rows if keys is None else [r for r in rows if r["key"] in keys])
    for clause in where:
        if "=" not in clause:
            raise ResultsError(f"filter {clause!r} is not of the form column=value (e.g. dataset=gsm8k)")
        column, _, value = clause.partition("=")
        _require(df, [column])
        df = df[df[column].astype(str).isin(value.split(","))]
        if df.empty:
            raise ResultsError(f"no rows left after the filter {clause!r}")
    return df


def _require(df: pd.DataFrame, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        usable = sorted(c for c in df.columns if c not in ("accepted_hist",))
        raise ResultsError(f"unknown column(s) {missing}; the results have: {', '.join(usable)}")


def summarize(df: pd.DataFrame, rows: Sequence[str], cols: Sequence[str], values: Sequence[str]) -> pd.DataFrame:
    """mean / std / sem / n of each value per (rows, cols) group; AR rows first, groups in sorted order."""
    rows, cols, values = list(rows), list(cols), list(values)
    _require(df, rows + cols + values)
    non_numeric = [v for v in values if not pd.api.types.is_numeric_dtype(df[v])]
    if non_numeric:
        raise ResultsError(f"value column(s) {non_numeric} are not numeric; pick e.g. tau, speedup_decode, decode_tok_s")
    if not rows:  # one table row over everything
        df, rows = df.assign(all="all"), ["all"]
    group = rows + cols
    ordered = df.assign(_not_ar=df["drafter"] != "ar").sort_values(["_not_ar", *group], kind="stable")
    grouped = ordered.groupby(group, dropna=False, sort=False)[values]
    stats = grouped.agg(["mean", "std", "count"])
    for v in values:
        stats[(v, "sem")] = stats[(v, "std")] / stats[(v, "count")].pow(0.5)
    return stats


def _num(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.2f}"


def pivot_cells(stats: pd.DataFrame, cols: Sequence[str], values: Sequence[str], spread: str) -> pd.DataFrame:
    """String cells 'mean ± spread', rows x (value, col) with flattened column names. `stats` comes from
    `summarize`, which keeps at least one row level."""
    if spread not in SPREADS:
        raise ResultsError(f"spread must be one of {SPREADS}, got {spread!r}")
    cells = pd.DataFrame(index=stats.index)
    for v in values:
        mean, n = stats[(v, "mean")], stats[(v, "count")]
        if spread == "none":
            cells[v] = [_num(m) for m in mean]
        else:
            sd = stats[(v, spread)]
            cells[v] = [_num(m) if c < 2 or math.isnan(s) else f"{_num(m)} ± {_num(s)}" for m, s, c in zip(mean, sd, n)]
    if cols:
        cells = cells.unstack(list(cols), fill_value="–")
        flat = []
        for key in cells.columns:
            value, col_values = key[0], [str(k) for k in key[1:]]
            label = "/".join(col_values)
            flat.append(label if len(values) == 1 else f"{value} · {label}")
        cells.columns = flat
    return cells


def _escape_latex(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("&", r"\&"), ("%", r"\%"), ("#", r"\#"), ("$", r"\$")):
        text = text.replace(a, b)
    return text.replace("±", r"$\pm$")


def render(cells: pd.DataFrame, fmt: str) -> str:
    """A string-cell table as markdown or LaTeX (index levels become the leading columns)."""
    names = [str(n) for n in cells.index.names]
    header = names + [str(c) for c in cells.columns]
    body = []
    for idx, row in cells.iterrows():
        idx = idx if isinstance(idx, tuple) else (idx,)
        body.append([str(i) for i in idx] + [str(x) for x in row])
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join(["---"] * len(names) + ["---:"] * len(cells.columns)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines)
    if fmt == "latex":
        spec = "l" * len(names) + "r" * len(cells.columns)
        lines = [rf"\begin{{tabular}}{{{spec}}}", r"\toprule", " & ".join(_escape_latex(h) for h in header) + r" \\",
                 r"\midrule"]
        lines += [" & ".join(_escape_latex(c) for c in r) + r" \\" for r in body]
        lines += [r"\bottomrule", r"\end{tabular}"]
        return "\n".join(lines)
    raise ResultsError(f"format must be one of {FORMATS}, got {fmt!r}")


def numeric_pivot(stats: pd.DataFrame, cols: Sequence[str], values: Sequence[str]) -> pd.DataFrame:
    """For CSV: mean, std and n as numbers, columns '<value> <stat>[ <col>]'."""
    keep = stats[[(v, s) for v in values for s in ("mean", "std", "count")]]
    if cols:
        keep = keep.unstack(list(cols))
    keep.columns = [" ".join(str(k) for k in key) for key in keep.columns]
    return keep


def make_table(paths: Iterable[str | Path], rows: Sequence[str] = ("drafter", "tree", "budget"),
               cols: Sequence[str] = ("dataset",), values: Sequence[str] = ("tau",), fmt: str = "markdown",
               spread: str = "std", where: Sequence[str] = (), keys: Collection[str] | None = None) -> str:
    """The text of `specbench table`."""
    if fmt not in FORMATS:
        raise ResultsError(f"format must be one of {FORMATS}, got {fmt!r}")
    df = load_frame(paths, where, keys)
    stats = summarize(df, rows, cols, values)
    if fmt == "csv":
        return numeric_pivot(stats, cols, values).to_csv()
    text = render(pivot_cells(stats, cols, values, spread), fmt)
    counts = stats[[(v, "count") for v in values]].to_numpy()
    n = f"{int(counts.min())}" if counts.min() == counts.max() else f"{int(counts.min())}–{int(counts.max())}"
    legend = f"mean{'' if spread == 'none' else ' ± ' + spread} over prompts, n = {n} per cell"
    if any(v.startswith("speedup") for v in values):
        legend += f"; {SPEEDUP_LEGEND}"
    return text + ("\n\n" + legend if fmt == "markdown" else "\n% " + legend)
