"""A replay study (`Study(replay=True)`): rows by exact replay through the harness, equal to the real
decode loop's tau and output per prompt, resumable, printable by `specbench table` and `plot`; only
greedy T = 0 configurations are accepted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specbench.bench import Grid, Study
from specbench.bench.plots import make_plots
from specbench.bench.runner import run_study
from specbench.bench.store import read_rows
from specbench.bench.study import StudyError
from specbench.bench.table import make_table


def replay_study(study: Study) -> Study:
    grids = (Grid(drafters=("ngram",), trees=("ddtree", "chain"), budgets=(3, 8)),
             Grid(drafters=("self",), trees=("chain",), budgets=(3,), drafter_args=({"layers": 1},)))
    return dataclasses.replace(study, name="tiny_replay", grids=grids, replay=True)


def test_replay_rows_equal_decoding_and_resume(tmp_path: Path, tiny_study: Study) -> None:
    study = replay_study(tiny_study)
    decoded = run_study(dataclasses.replace(study, replay=False), out_dir=tmp_path / "decode", progress=False,
                        log=lambda m: None)
    done = run_study(study, out_dir=tmp_path / "replay", progress=False, log=lambda m: None)
    assert done.total == done.written == 5 * 5  # 5 configurations (no AR) x (3 single-turn items + 2 turns)
    rows = read_rows(done.results)
    assert all(r["mode"] == "replay" and r["drafter"] != "ar" for r in rows)
    by_unit = {(r["config_key"], r["item_id"], r["turn"]): r for r in read_rows(decoded.results) if r["drafter"] != "ar"}
    sd_keys = {(r["drafter"], r["tree"], r["budget"], r["drafter_args"]): r["config_key"] for r in by_unit.values()}
    for r in rows:
        want = by_unit[(sd_keys[(r["drafter"], r["tree"], r["budget"], r["drafter_args"])], r["item_id"], r["turn"])]
        assert (r["tau"], r["rounds"], r["output_ids"]) == (want["tau"], want["rounds"], want["output_ids"])
        assert {int(k): v for k, v in r["accepted_hist"].items()} == {int(k): v for k, v in want["accepted_hist"].items()}
    assert not {r["key"] for r in rows} & {r["key"] for r in read_rows(decoded.results)}  # keyed apart

    again = run_study(study, out_dir=tmp_path / "replay", progress=False, log=lambda m: None)
    assert again.written == 0
    table = make_table([done.results], rows=("drafter", "tree", "budget"), cols=("turn",), values=("tau",))
    assert "ngram | ddtree | 8" in table
    plots = make_plots([done.results], tmp_path / "plots")
    assert [p.name for p in plots] == ["tau_vs_budget.png", "accept_by_depth.png"]  # no speed-up without timings


def test_replay_needs_greedy_at_t0(tiny_study: Study) -> None:
    study = replay_study(tiny_study)
    with pytest.raises(StudyError, match="verifiers=\\[greedy\\] and temperatures=\\[0\\]"):
        run_study(study.with_overrides(["temperatures=[1.0]", "verifiers=[sample-walk]"]), progress=False,
                  log=lambda m: None)
