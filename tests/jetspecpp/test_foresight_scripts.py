"""The foresight scripts on the CPU: foresight_hits' evaluation step over stored records (tables,
hits.json, a loadable calibration), and foresight_table's per-generation measurement with a
pipelined jetspec++ decoder (hit flags aligned with rounds, tau on hits and misses, exposed time) and
its table."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbench.config import SpecConfig
from specbench.drafters.jetspecpp.calibration import RowTemperature
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.engine import SpecDecoder

from test_foresight_selection import synthetic_rounds

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_foresight_hits_evaluates_stored_records(tmp_path) -> None:
    folder = tmp_path / "records"
    folder.mkdir()
    for i, ds in enumerate(["gsm8k", "gsm8k", "math500", "math500"]):
        recs = synthetic_rounds(30, seed=10 + i, overconfidence=2.0)
        torch.save({"meta": {"dataset": ds, "id": str(i), "tau": 1.5, "rounds": len(recs), "time_s": 0.0},
                    "records": [r.to_dict() for r in recs]}, folder / f"{ds}-{i}.pt")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "foresight_hits.py"), "--out", str(tmp_path), "--eval-only"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "calibrated" in run.stdout and "ssd-decoder" in run.stdout and "reliability" in run.stdout
    summary = json.loads((tmp_path / "hits.json").read_text())
    assert {r["B"] for r in summary["hit_rates"]} == {1, 4, 8, 16}
    assert summary["prompts"] == {"gsm8k": 2, "math500": 2}
    assert RowTemperature.load(tmp_path / "calibration.json").betas == tuple(summary["calibration"])
    assert load_script("foresight_hits").stem("math500", "test/precalculus/1.json") == "math500-test_precalculus_1.json"


@pytest.mark.parametrize("device_round", [False, True], ids=["host-round", "device-round"])
def test_foresight_table_measures_a_pipelined_generation(tiny, trained_jpp, tmp_path, device_round: bool) -> None:
    table = load_script("foresight_table")
    obj, _ = trained_jpp
    kw = {"calibration": RowTemperature((16.0,))} if device_round else {"states": "true"}
    drafter = JetSpecPPDrafter(tiny, head=obj.draft, adapter=obj.adapter, J=1, R=1, foresight="on", B=8, **kw)
    decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree="chain", budget=5), drafter=drafter, max_seq_len=160)
    assert decoder.branching is device_round
    decoder.generate([1, 2, 3], 4)  # a warm-up request: its rounds must not leak into the next row
    row = table.measure(decoder, [5, 17, 33, 2, 90, 41], 32)
    assert row["rounds"] > 5 and 0 < row["hit_rate"] <= 1
    assert row["tau_hit"] is not None and row["round_ms"] > 0 and "stage_foresight_ms" in row and "stage_verify_forward_ms" in row
    assert abs(row["exposed_ms"] - (row["round_ms"] - row["verify_ms"])) < 1e-9
    rows = [dict(row, config="jetspec++ pipelined", dataset="gsm8k", id="0", speedup=1.0),
            dict(row, config="ar", dataset="gsm8k", id="0", speedup=1.0)]
    out = tmp_path / "t.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "foresight_table.py"), "--out", str(out), "--table-only"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "jetspec++ pipelined" in run.stdout and "exposed_ms" in run.stdout
    args = argparse.Namespace(head="H", J=1, R=1, states="predicted", draft_device=None, draft_copy=False, B=16,
                              calibration=None, tree="chain:16",
                              configs="jetspec++ pipelined,jetspec++ pipelined host")
    cfgs = table.configs(args)
    assert "host" not in cfgs["jetspec++ pipelined"]["args"] and cfgs["jetspec++ pipelined host"]["args"]["host"] is True
    assert "draft_copy" not in cfgs["jetspec++ pipelined"]["args"]
    cfgs = table.configs(argparse.Namespace(**{**vars(args), "draft_device": "cuda:0", "draft_copy": True}))
    assert cfgs["jetspec++ pipelined"]["args"]["draft_copy"] is True
    assert cfgs["jetspec++ pipelined"]["args"]["draft_device"] == "cuda:0"


def test_foresight_table_keeps_the_median_of_repeats() -> None:
    keep = load_script("foresight_table").keep_median
    runs = [{"round_ms": t, "tok_s": 1 / t, "output": [1, 2]} for t in (3.0, 1.0, 2.0)]
    kept = keep(runs)
    assert kept["round_ms"] == 2.0 and kept["repeats"] == 3 and kept["repeats_agree"]
    assert kept["tok_s_repeats"] == [1 / 3.0, 1.0, 0.5]
    assert not keep(runs[:2] + [{"round_ms": 5.0, "tok_s": 0.2, "output": [1, 3]}])["repeats_agree"]
