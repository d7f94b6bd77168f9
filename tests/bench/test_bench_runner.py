"""The runner on a tiny random target: interrupted runs resume with nothing lost or counted twice,
rows carry what a table needs, and greedy SD reproduces AR through the whole harness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbench.bench import DatasetSpec, Study
from specbench.bench.runner import run_study
from specbench.bench.store import ResultsError, ResultsStore, read_rows
from specbench.bench.table import make_table
from specbench.data import DataError


class Interrupt(Exception):
    pass


def interrupt_after(k: int):  # type: ignore[no-untyped-def]
    seen = []

    def on_row(row: dict) -> None:
        seen.append(row["key"])
        if len(seen) == k:
            raise Interrupt

    return on_row


def tau_table(path: Path) -> str:
    return make_table([path], rows=("drafter", "tree", "budget"), cols=("dataset", "turn"), values=("tau", "new_tokens"))


def test_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path: Path, tiny_study: Study) -> None:
    full = run_study(tiny_study, out_dir=tmp_path / "full", progress=False, log=lambda m: None)
    assert full.total == full.written == 3 * 5  # (AR + ngram + self) x (3 single-turn items + 2 turns)

    # Interrupt after 4 rows: turn 0 of the two-turn item for every configuration, then AR's turn 1.
    with pytest.raises(Interrupt):
        run_study(tiny_study, out_dir=tmp_path / "cut", progress=False, on_row=interrupt_after(4), log=lambda m: None)
    results = tmp_path / "cut" / "results.jsonl"
    assert len(read_rows(results)) == 4
    with open(results, "a") as f:  # a crash in the middle of writing the next row
        f.write('{"key": "torn", "tau": 1.')
    resumed = run_study(tiny_study, out_dir=tmp_path / "cut", progress=False, log=lambda m: None)
    assert resumed.written == 15 - 4

    rows_full, rows_cut = read_rows(full.results), read_rows(results)
    assert len(rows_cut) == 15 and len({r["key"] for r in rows_cut}) == 15
    assert {r["key"]: r["output_ids"] for r in rows_cut} == {r["key"]: r["output_ids"] for r in rows_full}
    assert tau_table(results) == tau_table(full.results)

    again = run_study(tiny_study, out_dir=tmp_path / "cut", progress=False, log=lambda m: None)
    assert again.written == 0 and len(read_rows(results)) == 15


def test_rows_carry_config_provenance_and_their_baseline(tmp_path: Path, tiny_study: Study) -> None:
    result = run_study(tiny_study.with_overrides(["n=2"]), out_dir=tmp_path, progress=False, log=lambda m: None)
    rows = read_rows(result.results)
    by_key = {r["key"]: r for r in rows}
    for row in rows:
        assert row["config"]["target"] == "random:tiny-llama" and row["config"]["spec"]["budget"] >= 1
        assert row["provenance"]["torch"] and row["provenance"]["device_name"]
        assert set(row["provenance"]["packages"]) >= {"specbench", "torch"}
        base = by_key[row["baseline_key"]]
        assert base["drafter"] == "ar" and (base["item_id"], base["turn"]) == (row["item_id"], row["turn"])
        assert row["tau"] >= 1.0 and row["new_tokens"] == 12 and row["decode_s"] > 0
        assert set(row["stage_s"]) >= {"draft", "verify_forward", "verify", "commit"}
    assert {r["drafter"] for r in rows} == {"ar", "ngram", "self"}


def test_greedy_sd_reproduces_ar_through_the_harness(tmp_path: Path, tiny_study: Study) -> None:
    """fp32 greedy SD is lossless, so every configuration emits AR's tokens on every turn; this also
    checks that the second turn is built from each configuration's own first answer."""
    rows = read_rows(run_study(tiny_study, out_dir=tmp_path, progress=False, log=lambda m: None).results)
    outputs: dict[tuple[str, int], set[tuple[int, ...]]] = {}
    for r in rows:
        outputs.setdefault((r["item_id"], r["turn"]), set()).add(tuple(r["output_ids"]))
    assert len(outputs) == 5 and all(len(v) == 1 for v in outputs.values())
    second = [r for r in rows if r["turn"] == 1]
    first = {r["drafter"]: r for r in rows if r["turn"] == 0 and r["item_id"] == "two-turn"}
    assert all(r["prompt_tokens"] == 12 + len(first[r["drafter"]]["output_ids"]) + 5 for r in second)


def test_text_prompts_on_a_tokenizer_less_target_fail_clearly(tmp_path: Path, tiny_study: Study) -> None:
    study = tiny_study.with_overrides(["datasets=[builtin]", "n=1"])
    with pytest.raises(DataError, match="no tokenizer"):
        run_study(study, out_dir=tmp_path, progress=False, log=lambda m: None)


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.jsonl") as store:
        store.append({"key": "a", "x": 1})
        with pytest.raises(ResultsError, match="another run is writing"):
            ResultsStore(tmp_path / "results.jsonl")
    assert [json.loads(line)["key"] for line in (tmp_path / "results.jsonl").read_text().splitlines()] == ["a"]


def test_store_completes_an_unterminated_but_whole_last_row(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text('{"key": "a"}\n{"key": "b"}')
    with ResultsStore(path) as store:
        assert not store.dropped_partial_line and "b" in store
        store.append({"key": "c"})
    assert [r["key"] for r in read_rows(path)] == ["a", "b", "c"]


def test_unknown_dataset_fails_before_any_model_loads(tmp_path: Path, tiny_study: Study) -> None:
    study = Study(name="x", grids=tiny_study.grids, targets=tiny_study.targets, datasets=(DatasetSpec("gsm9k"),))
    with pytest.raises(DataError, match="unknown dataset 'gsm9k'"):
        run_study(study, out_dir=tmp_path, progress=False, log=lambda m: None)
    assert not (tmp_path / "results.jsonl").exists()


def test_the_printed_table_covers_only_the_study_run(tmp_path: Path, tiny_study: Study) -> None:
    run_study(tiny_study, out_dir=tmp_path, progress=False, log=lambda m: None)
    smaller = run_study(tiny_study.with_overrides(["n=1", "drafters=[ngram]"]), out_dir=tmp_path, progress=False,
                        log=lambda m: None)
    assert smaller.written == 0 and smaller.total == len(smaller.keys) == 2 * 2  # (AR, ngram) x two turns
    text = make_table([smaller.results], rows=("drafter",), cols=(), values=("tau",), keys=smaller.keys)
    assert "n = 2 per cell" in text and "| self |" not in text
    assert "| self |" in make_table([smaller.results], rows=("drafter",), cols=(), values=("tau",))


def test_an_optional_drafter_whose_weights_do_not_load_is_skipped_with_a_note(
        tmp_path: Path, tiny_study: Study, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "brokenhead_mod.py").write_text(
        "from specbench.drafters.base import Drafter\n"
        "class BrokenHead(Drafter):\n"
        "    policies, taps, weights = 'any', (), None\n"
        "    def __init__(self, target):\n"
        "        raise FileNotFoundError('no weights for BrokenHead')\n"
        "    def draft(self, state, policy, budget):\n"
        "        raise AssertionError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    optional = tiny_study.with_overrides(["n=2", "drafters=[ngram, 'brokenhead_mod:BrokenHead']", "optional=true"])
    result = run_study(optional, out_dir=tmp_path / "a", progress=False, log=lambda m: None)
    assert {r["drafter"] for r in read_rows(result.results)} == {"ar", "ngram"}
    assert result.written == 2 * 3 and result.skipped == 3
    assert any("cannot build it: FileNotFoundError: no weights for BrokenHead" in n for n in result.notes)
    with pytest.raises(FileNotFoundError, match="no weights"):
        run_study(optional.with_overrides(["optional=false"]), out_dir=tmp_path / "b", progress=False, log=lambda m: None)


def test_timing_repeats_keep_the_median_run_and_say_so(tmp_path: Path, tiny_study: Study) -> None:
    """Each prompt decoded three times: the row's decode time is the median of the three it lists, the
    repeats emitted the same tokens (greedy), and the output is the single-run study's."""
    import dataclasses

    once = read_rows(run_study(tiny_study, out_dir=tmp_path / "once", progress=False, log=lambda m: None).results)
    study = dataclasses.replace(tiny_study, timing_repeats=3)
    rows = read_rows(run_study(study, out_dir=tmp_path / "thrice", progress=False, log=lambda m: None).results)
    assert len(rows) == len(once)
    for row in rows:
        times = row["decode_s_repeats"]
        assert row["timing_repeats"] == 3 and len(times) == 3 and row["repeats_agree"]
        assert row["decode_s"] == sorted(times)[1] and row["gc_s"] >= 0
    assert {r["key"]: r["output_ids"] for r in rows} == {r["key"]: r["output_ids"] for r in once}


def test_median_by_is_the_lower_middle() -> None:
    from specbench.bench.runner import median_by

    times = [0.9, 0.1, 0.5, 0.3]
    assert median_by(times, key=float) == 0.3
    assert median_by(times[:3], key=float) == 0.5
    assert median_by([("a", 2.0), ("b", 1.0), ("c", 3.0)], key=lambda t: t[1]) == ("a", 2.0)


def test_timing_repeats_must_be_a_positive_integer(tiny_study: Study) -> None:
    import dataclasses

    from specbench.bench.study import StudyError

    for bad in (0, -1, 1.5, True):
        with pytest.raises(StudyError, match="timing_repeats"):
            dataclasses.replace(tiny_study, timing_repeats=bad)


def test_collector_time_counts_a_collection_inside_the_block_only() -> None:
    import gc

    from specbench.bench.runner import CollectorTime

    with CollectorTime() as t:
        junk = [[i] for i in range(20000)]
        for a, b in zip(junk, junk[1:]):
            a.append(b)  # reference cycles for the collector to walk
        gc.collect()
    assert t.seconds > 0
    before = t.seconds
    gc.collect()
    assert t.seconds == before and t._callback not in gc.callbacks
