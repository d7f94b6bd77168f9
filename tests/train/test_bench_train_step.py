"""scripts/bench_train_step.py on a tiny random target: every variant timed with its parts, the first-step
losses compared, the chosen variant written, and bad variants refused naming the flag."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench_train_step.py"


def test_bench_train_step_times_parts_and_chooses(tmp_path) -> None:
    out, chosen = tmp_path / "bench.json", tmp_path / "chosen.txt"
    res = subprocess.run([sys.executable, str(SCRIPT), "--target", "random:tiny-llama", "--device", "cpu", "--synthetic", "10",
                          "--max-len", "512", "--steps", "1", "--warmup", "1", "--variants", "none/2,bf16/2,none/3,none/2/chain",
                          "--heads", "dflash,jetspec-tree", "--min-gain", "1000", "--json", str(out), "--choose", str(chosen)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [r["variant"] for r in report["variants"]] == ["none/2", "bf16/2", "none/3", "none/2/chain"]
    assert [r["kl"] for r in report["variants"]] == ["fused", "fused", "fused", "chain"]
    assert report["variants"][3]["losses_close"] is True  # the KL's autograd chain: the same losses
    for row in report["variants"]:
        assert set(row["parts_ms"]) == {"target forward", "dflash", "jetspec-tree"}
        assert row["step_ms"] > 0 and row["resp_tok_s"] > 0 and set(row["first_losses"]) == {"dflash/loss", "jetspec-tree/loss"}
    assert report["variants"][1]["losses_close"] is True  # bf16 rounding only, on the same batch and draws
    assert "losses_close" not in report["variants"][2]  # another batch size: its first batch differs
    assert chosen.read_text() == "none 2\n"  # no variant beats the first by 1000x
    assert "first-step losses vs none/2" in res.stdout


def test_bench_train_step_refuses_bad_variants(tmp_path) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), "--target", "random:tiny-llama", "--device", "cpu", "--synthetic", "4",
                          "--variants", "fp16/8"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2 and "--variants takes AUTOCAST/BATCH" in res.stderr
    res = subprocess.run([sys.executable, str(SCRIPT), "--target", "random:tiny-llama", "--device", "cpu", "--synthetic", "4",
                          "--variants", "none/8/fast"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2 and "AUTOCAST/BATCH[/chain]" in res.stderr


def test_choose_picks_autocast_per_head() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train_step", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    losses = {"a/loss": 2.0, "b/loss": 3.0}
    base = {"autocast": "none", "batch": 16, "parts_ms": {"target forward": 30.0, "a": 100.0, "b": 60.0},
            "first_losses": losses}
    mixed = {"autocast": "bf16", "batch": 16, "parts_ms": {"target forward": 29.0, "a": 60.0, "b": 900.0},
             "first_losses": {"a/loss": 2.001, "b/loss": 3.0}}
    wide = {"autocast": "bf16", "batch": 32, "parts_ms": {"target forward": 50.0, "a": 90.0, "b": 900.0},
            "first_losses": {"a/loss": 9.0, "b/loss": 9.0}}
    assert mod.choose([base, mixed, wide], tol=0.02, min_gain=0.05) == ("a", 16)  # b got slower: stays fp32
    assert mixed["losses_close"] and "losses_close" not in wide
    both = {**mixed, "parts_ms": {"target forward": 29.0, "a": 60.0, "b": 30.0}}
    assert mod.choose([base, both], tol=0.02, min_gain=0.05) == ("bf16", 16)
    far = {**both, "first_losses": {"a/loss": 2.5, "b/loss": 3.0}}
    assert mod.choose([base, far], tol=0.02, min_gain=0.05) == ("none", 16)  # losses moved: no autocast
