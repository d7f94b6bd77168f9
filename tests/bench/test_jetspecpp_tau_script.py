"""scripts/jetspecpp_tau.py --parallel: shard processes merged into one file hold exactly the rows of one
uninterrupted run, each once (the shipped jetspec++ head on the default target, a few tokens)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "jetspecpp_tau.py"
HEAD = Path(__file__).resolve().parents[2] / "specbench" / "heads" / "jetspec++-smollm2-135m"


def run_script(data: Path, out: Path, *extra: str) -> None:
    cmd = [sys.executable, str(SCRIPT), "--data", str(data), "--out", str(out), "--datasets", "gsm8k", "--n", "3",
           "--head", f"jetspec++={HEAD}", "--settings", "J0R0,J1R1", "--trees", "chain:4", "--max-new-tokens", "6",
           "--threads", "1", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_parallel_shards_equal_one_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    questions = ["What is 2 + 3?", "Name a colour.", "Count to five."]
    (data / "gsm8k_test.jsonl").write_text("".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n"
                                                   for q in questions))
    whole, merged = tmp_path / "whole.jsonl", tmp_path / "merged.jsonl"
    run_script(data, whole)
    run_script(data, merged, "--n", "1")  # item 0 first: the shards resume from it
    run_script(data, merged, "--parallel", "2")
    key = ("id", "head", "setting", "tree", "budget")
    a = {tuple(r[k] for k in key): r for r in map(json.loads, whole.read_text().splitlines())}
    rows = [json.loads(line) for line in merged.read_text().splitlines()]
    b = {tuple(r[k] for k in key): r for r in rows}
    assert len(b) == len(rows) == len(a) == 3 * 2, "duplicate or missing rows"
    for k in a:
        assert (a[k]["tau"], a[k]["new_tokens"]) == (b[k]["tau"], b[k]["new_tokens"]), k


def test_paired_compare_uses_only_prompts_both_configurations_have() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    import jetspecpp_tau

    def row(setting: str, pid: str, tau: float, tree: str = "chain") -> dict:
        return {"dataset": "gsm8k", "id": pid, "head": "h", "setting": setting, "tree": tree, "budget": 16, "tau": tau}

    rows = [row("J0R0", "0", 1.0), row("J1R0", "0", 1.5), row("J0R0", "1", 2.0), row("J1R0", "1", 2.1),
            row("J0R0", "2", 9.0),  # no J1R0 row: not paired, left out
            row("J0R0", "0", 3.0, "ddtree"), row("J1R0", "0", 2.0, "ddtree")]
    got = {d["tree"]: d for d in jetspecpp_tau.paired(rows, "h J1R0 - h J0R0")}
    assert got["chain/16"]["n"] == 2 and abs(got["chain/16"]["mean"] - 0.3) < 1e-12
    assert abs(got["chain/16"]["se"] - 0.2) < 1e-12  # differences 0.5, 0.1: sd 0.2828 / sqrt(2)
    assert got["ddtree/16"]["n"] == 1 and got["ddtree/16"]["mean"] == -1.0
    with pytest.raises(SystemExit, match="HEAD SETTING - HEAD SETTING"):
        jetspecpp_tau.paired(rows, "h J1R0 minus h J0R0")


def test_parallel_workers_are_sized_by_their_configurations() -> None:
    """--parallel on CUDA is capped by GPU memory per configuration (as tau_table's): a worker holds one graphed
    decoder per head x setting x tree, so 4 heads x 6 settings x 2 trees on an H100 get fewer than 14 workers."""
    import argparse

    sys.path.insert(0, str(SCRIPT.parent))
    import jetspecpp_tau
    import tau_table

    args = argparse.Namespace(head=["a=w", "b=x", "c=y", "d=z"], settings="J0R0,J1R0,J2R0,J3R0,J1R1,J1R1n", trees="chain:16,ddtree:64")
    assert jetspecpp_tau.worker_configs(args) == 48
    assert tau_table.workers_that_fit(14, jetspecpp_tau.worker_configs(args), 79.2) < 14
