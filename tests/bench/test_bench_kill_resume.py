"""A study killed with SIGKILL in the middle of a run and resumed by running the same command again
holds exactly the rows of an uninterrupted run: the same keys in the same order, and every field equal
except the measured times (and the process's peak memory)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from specbench.bench.store import read_rows

REPO = Path(__file__).resolve().parents[2]
MEASURED = {"finished_at", "prefill_s", "decode_s", "decode_tok_s", "e2e_tok_s", "stage_s", "process_max_rss_bytes",
            "peak_memory_bytes", "decode_s_repeats", "gc_s"}


def write_study(tmp_path: Path) -> Path:
    rng = random.Random(1)
    data = tmp_path / "ids.jsonl"
    rows = [{"qid": "chat", "ids": [[rng.randrange(96) for _ in range(10)], [rng.randrange(96) for _ in range(4)]]}]
    rows += [{"qid": f"p{i}", "ids": [rng.randrange(96) for _ in range(12)] * 2} for i in range(11)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    study = tmp_path / "killed.py"
    study.write_text(
        "from specbench.bench import DatasetSpec, Grid, Study\n"
        "STUDY = Study(name='killed', targets=('random:tiny-llama',), max_seq_len=256, max_new_tokens=(40,),\n"
        "              warmup_tokens=2, grids=(Grid(drafters=('ngram', 'self'), budgets=(3,)),),\n"
        f"              datasets=(DatasetSpec('jsonl:{data}', args={{'prompt_field': 'ids', 'id_field': 'qid'}}),))\n")
    return study


def command(study: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "specbench.cli", "run", str(study), "--out", str(out), "--no-progress"]


def comparable(path: Path) -> list[dict]:
    """The rows less what is measured, and less the checkout's git state in their provenance (a commit made
    while the test runs, as in a shared development checkout, would otherwise differ between the runs)."""
    rows = [{k: v for k, v in row.items() if k not in MEASURED} for row in read_rows(path)]
    for row in rows:
        if isinstance(row.get("provenance"), dict):
            row["provenance"] = {k: v for k, v in row["provenance"].items() if k != "git"}
    return rows


def test_a_killed_study_resumes_to_exactly_the_rows_of_an_uninterrupted_one(tmp_path: Path) -> None:
    study = write_study(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    full = subprocess.run(command(study, tmp_path / "full"), env=env, capture_output=True, text=True, timeout=600)
    assert full.returncode == 0, full.stderr
    expected = comparable(tmp_path / "full" / "results.jsonl")
    assert len(expected) == 3 * 13  # (AR, ngram, self) x (11 single-turn items + 2 turns)

    results = tmp_path / "cut" / "results.jsonl"
    proc = subprocess.Popen(command(study, tmp_path / "cut"), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (results.exists() and results.read_bytes().count(b"\n") >= 7):
        assert proc.poll() is None, "the run finished before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = results.read_bytes().count(b"\n")
    assert 7 <= kept < len(expected)

    resumed = subprocess.run(command(study, tmp_path / "cut"), env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(expected) - kept} new of {len(expected)} generations" in resumed.stdout
    assert comparable(results) == expected
