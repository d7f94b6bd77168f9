"""scripts/tau_table.py: a table filled in pieces (a first run over some items, a second machine from the
other end with --reverse) has exactly the rows of one uninterrupted run, each once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tau_table.py"


def run_script(data: Path, out: Path, *extra: str) -> None:
    cmd = [sys.executable, str(SCRIPT), "--data", str(data), "--out", str(out), "--datasets", "gsm8k",
           "--drafters", "ngram,self", "--budgets", "4", "--self-budgets", "2", "--max-new-tokens", "8",
           "--threads", "1", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def rows_by_key(path: Path) -> dict[tuple, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    keyed = {(r["id"], r["drafter"], r["tree"], r["budget"]): r for r in rows}
    assert len(keyed) == len(rows), "duplicate rows"
    return keyed


def test_pieces_from_both_ends_equal_one_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    questions = ["What is 2 + 3?", "Name a colour.", "Count to five.", "Say hello in French."]
    (data / "gsm8k_test.jsonl").write_text("".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n"
                                                   for q in questions))
    whole, pieces = tmp_path / "whole.jsonl", tmp_path / "pieces.jsonl"
    run_script(data, whole, "--n", "4")
    run_script(data, pieces, "--n", "1")                  # item 0
    run_script(data, pieces, "--n", "4", "--reverse")     # items 3, 2, 1; item 0 is skipped
    order = [json.loads(line)["id"] for line in pieces.read_text().splitlines()]
    assert list(dict.fromkeys(order)) == ["0", "3", "2", "1"]
    a, b = rows_by_key(whole), rows_by_key(pieces)
    assert a.keys() == b.keys() and len(a) == 4 * 2  # ngram/ddtree/4 and self/chain/2 per item
    for key in a:
        assert (a[key]["tau"], a[key]["new_tokens"]) == (b[key]["tau"], b[key]["new_tokens"]), key
