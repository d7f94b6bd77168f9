"""Tables and plots from a hand-written results file with known numbers, and the CLI's error paths."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest

from specbench.bench.cli import main
from specbench.bench.plots import make_plots
from specbench.bench.store import ResultsError
from specbench.bench.table import load_frame, make_table


def row(key: str, baseline: str, drafter: str, budget: int, item: str, tau: float, decode_tok_s: float,
        e2e_tok_s: float, dataset: str = "gsm8k", hist: dict | None = None) -> dict:
    return {"key": key, "baseline_key": baseline, "drafter": drafter, "tree": "-" if drafter == "ar" else "chain",
            "verifier": "greedy", "budget": budget, "temperature": 0.0, "dataset": dataset, "item_id": item, "turn": 0,
            "tau": tau, "decode_tok_s": decode_tok_s, "e2e_tok_s": e2e_tok_s, "new_tokens": 10,
            "stage_s": {"draft": 0.1, "verify": 0.2}, "accepted_hist": hist or {"0": 1},
            "accept_by_depth": [], "config": {"target": "t"}, "provenance": {"device": "cpu"}}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    rows = [
        row("A1", "A1", "ar", 0, "1", 1.0, 10.0, 8.0), row("A2", "A2", "ar", 0, "2", 1.0, 20.0, 16.0),
        row("N1", "A1", "ngram", 8, "1", 2.0, 30.0, 16.0, hist={"0": 2, "3": 2}),
        row("N2", "A2", "ngram", 8, "2", 3.0, 30.0, 16.0, hist={"1": 1, "2": 3}),
        row("M1", "A1", "ngram", 16, "1", 4.0, 40.0, 20.0, hist={"4": 4}),
        row("B1", "B1", "ar", 0, "x", 1.0, 10.0, 10.0, dataset="mbpp"),
        row("Q1", "B1", "ngram", 8, "x", 5.0, 50.0, 25.0, dataset="mbpp", hist={"5": 1}),
    ]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"key": "torn", "tau"')  # torn last line
    return path


def test_speedups_are_per_prompt_against_the_ar_row(results: Path) -> None:
    df = load_frame([results]).set_index("key")
    assert df.loc["N1", "speedup_decode"] == pytest.approx(3.0) and df.loc["N2", "speedup_decode"] == pytest.approx(1.5)
    assert df.loc["N1", "speedup_e2e"] == pytest.approx(2.0) and df.loc["A2", "speedup_decode"] == pytest.approx(1.0)
    assert df.loc["N2", "ar_decode_tok_s"] == 20.0 and df.loc["N1", "stage_draft_s"] == 0.1
    assert "torn" not in df.index


def test_markdown_pivot_means_and_spreads(results: Path) -> None:
    text = make_table([results], rows=("drafter", "budget"), cols=("dataset",), values=("tau",))
    lines = text.splitlines()
    assert lines[0] == "| drafter | budget | gsm8k | mbpp |"
    assert lines[2] == "| ar | 0 | 1.00 ± 0.00 | 1.00 |"  # AR first; one prompt: no spread
    assert "| ngram | 8 | 2.50 ± 0.71 | 5.00 |" in lines and "| ngram | 16 | 4.00 | – |" in lines
    two = make_table([results], rows=("drafter", "budget"), cols=(), values=("tau", "speedup_decode"),
                     where=("dataset=gsm8k",))
    assert "| ngram | 8 | 2.50 ± 0.71 | 2.25 ± 1.06 |" in two.splitlines()
    assert "prefill excluded" in two


def test_csv_and_latex(results: Path) -> None:
    csv = pd.read_csv(io.StringIO(make_table([results], rows=("drafter", "budget"), cols=("dataset",),
                                             values=("tau",), fmt="csv")))
    ngram8 = csv[(csv["drafter"] == "ngram") & (csv["budget"] == 8)].iloc[0]
    assert ngram8["tau mean gsm8k"] == pytest.approx(2.5) and ngram8["tau count gsm8k"] == 2
    latex = make_table([results], rows=("drafter",), cols=("dataset",), values=("tau",), fmt="latex")
    assert r"\begin{tabular}{lrr}" in latex and r"3.00 $\pm$ 1.00" in latex and r"\bottomrule" in latex


def test_table_errors(results: Path, tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match=r"unknown column\(s\) \['drafterz'\]; the results have: .*budget"):
        make_table([results], rows=("drafterz",))
    with pytest.raises(ResultsError, match="not numeric"):
        make_table([results], rows=("drafter",), values=("tree",))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "a"}\nnot json\n{"key": "b"}\n')
    with pytest.raises(ResultsError, match=r"bad.jsonl:2 is not valid JSON"):
        make_table([bad])
    with pytest.raises(ResultsError, match="no results at"):
        make_table([tmp_path / "missing"])


def test_plots_are_written(results: Path, tmp_path: Path) -> None:
    paths = make_plots([results], tmp_path / "plots")
    assert sorted(p.name for p in paths) == ["accept_by_depth.png", "speedup.png", "tau_vs_budget.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_a_single_budget_gets_bars_not_a_column_of_dots(results: Path, tmp_path: Path) -> None:
    paths = make_plots([results], tmp_path / "one", where=("budget=0,8",))  # AR and ngram at budget 8 only
    assert sorted(p.name for p in paths) == ["accept_by_depth.png", "speedup.png", "tau.png"]
    assert all(p.stat().st_size > 5000 for p in paths)


def test_cli_table_and_plot(results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", str(results.parent), "--rows", "drafter", "--cols", "", "--value", "tau"]) == 0
    out = capsys.readouterr().out
    assert "| drafter | tau |" in out and "| ngram | 3.50 ± 1.29 |" in out
    assert main(["plot", str(results), "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "speedup.png").is_file()


def test_cli_errors_are_one_line_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("STUDY = 3\n")
    assert main(["run", str(bad)]) == 2
    assert "specbench run: error:" in capsys.readouterr().err
    study = tmp_path / "needs_data.py"
    study.write_text("from specbench.bench import *\nSTUDY = Study(name='d', grids=(Grid(drafters=('ngram',)),), "
                     "datasets=('gsm8k',))\n")
    monkeypatch.delenv("SPECBENCH_DATA", raising=False)
    assert main(["run", str(study), "--out", str(tmp_path / "o")]) == 2
    assert "pass --data-dir DIR" in capsys.readouterr().err
    assert main(["run", str(study), "--data-dir", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["table", str(tmp_path / "nothing")]) == 2
    assert "no results at" in capsys.readouterr().err
