"""scripts/gpu_pipeline.sh: a phase whose deadline has passed (or is under MIN_PHASE_S away) is skipped and
said so, not started with a timeout of zero or less (a hold of 2026-12-07 lost its new heads' round table to
`timeout: invalid option -- '3'` when the int3 phase ran past NEWROUNDS_END_S)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_phases_past_their_deadline_are_skipped_and_listed(tmp_path: Path) -> None:
    (tmp_path / "pipe").mkdir()
    (tmp_path / "pipe" / "t0").write_text(f"{int(time.time()) - 100}\n")  # the pipeline started 100 s ago
    env = {**os.environ, "ROOT": str(tmp_path), "DEVICE": "cpu", "PHASES": "rounds newrounds fstable",
           "ROUNDS_END_S": "50", "NEWROUNDS_END_S": "120", "FS_END_S": "135", "MIN_PHASE_S": "30"}
    done = subprocess.run(["bash", "scripts/gpu_pipeline.sh", "run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    log = done.stdout + done.stderr
    left = {m[0]: int(m[1]) for m in re.findall(r"SKIPPED: (.+?) \((-?\d+) s left", log)}
    assert set(left) == {"round table", "new heads' round table", "the chain:16 foresight table"}, log
    assert -60 < left["round table"] <= -50
    assert 10 < left["new heads' round table"] <= 20   # time left, but under MIN_PHASE_S
    assert 25 < left["the chain:16 foresight table"] <= 35   # above MIN_PHASE_S, under the table's own 45 s
    assert "FAILED" not in log and "invalid option" not in log
    assert "pipeline done" in log
    assert (tmp_path / "pipe" / "failed.txt").read_text().splitlines() == [
        "round table skipped", "new heads' round table skipped", "the chain:16 foresight table skipped"]
