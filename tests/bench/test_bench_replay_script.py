"""scripts/bench_replay.py: the host walk and the device round replay the same references with the same
accepted counts (dflash's chain drafts on the device on the CPU too), and the rows say so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_replay.py"


@pytest.mark.slow  # a script run of ~25-50 s on CI's cores; tau_table's device-replay test checks the same agreement by default
def test_both_paths_agree_and_are_timed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "gsm8k_test.jsonl").write_text(json.dumps({"question": "What is 2 + 3?", "answer": "#### 5"}) + "\n")
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--data", str(data), "--datasets", "gsm8k",
                           "--n", "1", "--max-new-tokens", "12", "--configs", "dflash/chain/4", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["config"] == "dflash/chain/4" and row["prompts"] == 1 and row["rounds"] > 0
    assert row["agree"] and row["tau"] == row["tau_device"]
    assert row["host_s"] > 0 and row["device_s"] > 0
