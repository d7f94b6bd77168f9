"""scripts/tau_vs_tokens.py (through tau_table.py --heads) on a run directory whose snapshots hold
untrained heads of the default target: rows per labelled head, the table and the plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def fake_run(root: Path, target) -> Path:
    from specbench.drafters.heads.backbone import DraftHead, HeadConfig, default_taps
    from specbench.drafters.heads.checkpoint import save_head

    run = root / "run"
    for i, (tokens, label) in enumerate([(1000, "1k"), (5000, "5k")]):
        d = run / "snapshots" / f"tok{tokens:010d}"
        cfg = HeadConfig(drafter="jetspec", taps=default_taps(target.config.num_layers, 2), block_size=5,
                         attention="block-causal")
        head = DraftHead(target.config, cfg).init_weights(target.model, seed=i)
        save_head(d / "jetspec", head, cfg.to_dict(), target, storage="int8")
        (d / "snapshot.json").write_text(json.dumps({"milestone": tokens, "label": label, "tokens_seen": tokens + 7,
                                                     "step": i, "heads": ["jetspec"]}))
    return run


def test_tau_vs_tokens_on_snapshots(smollm2, tmp_path) -> None:
    run = fake_run(tmp_path, smollm2)
    data = tmp_path / "data"
    data.mkdir()
    (data / "gsm8k_test.jsonl").write_text(json.dumps({"question": "What is 2 + 3?", "answer": "#### 5"}) + "\n")
    out, png = tmp_path / "rows.jsonl", tmp_path / "curve.png"
    cmd = [sys.executable, str(REPO / "scripts" / "tau_vs_tokens.py"), "--run", str(run), "--data", str(data),
           "--out", str(out), "--datasets", "gsm8k", "--n", "1", "--budgets", "4", "--plot", str(png),
           "--max-new-tokens", "8", "--threads", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["drafter"], r["kind"], r["tree"], r["budget"]) for r in rows) == [
        ("jetspec@1k", "jetspec", "ddtree", 4), ("jetspec@5k", "jetspec", "ddtree", 4)]
    assert all(1.0 <= r["tau"] <= 5.0 for r in rows)
    assert "jetspec/ddtree/4" in done.stdout and png.is_file()
    again = subprocess.run(cmd + ["--table-only"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "1k" in again.stdout and "5k" in again.stdout


def test_head_labels_need_a_head_directory(tmp_path) -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    from tau_table import head_kind, parse_heads

    assert parse_heads("a=/x/y, b=z") == {"a": Path("/x/y"), "b": Path("z")}
    with pytest.raises(SystemExit, match="LABEL=DIR"):
        parse_heads("nolabel")
    with pytest.raises(SystemExit, match="not a head directory"):
        head_kind(tmp_path)
