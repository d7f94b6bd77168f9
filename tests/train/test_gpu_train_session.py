"""scripts/gpu_train_session.sh rehearsed on the CPU with a tiny random target, over three "sessions":
corpus shards made in one come back through a size-limited $OUT and are staged into the next, which
trains; its packed run comes back and the third session resumes it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

GEN = "--target random:tiny-llama --sets synthetic:12 --max-new-tokens 8 --temperatures 0,0.8"
TRAIN = ("--target random:tiny-llama --steps 6 --batch-size 2 --val-prompts 2 --head-arg block_size=4 "
         "--head-arg anchors=2 --val-every 2 --val-tau-every 0 --snapshot-tokens 20 --log-every 1")


def step(work: Path, root: Path, out: Path, name: str, **env: str) -> str:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    full = {**os.environ, "ROOT": str(root), "OUT": str(out), "DEVICE": "cpu", "OMP_NUM_THREADS": "1",
            "SPECBENCH_DATA": str(work / "data"), **env}
    done = subprocess.run(["bash", "scripts/gpu_train_session.sh", name], cwd=work, env=full, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = [f for f in out.rglob("*") if f.is_file()]
    assert len(files) <= 8 and sum(f.stat().st_size for f in files) <= 64 * 2**20
    assert all(f.stat().st_size <= 16 * 2**20 and f.relative_to(out).parts.__len__() <= 3 for f in files)
    return done.stdout


def stage(work: Path, *outs: Path) -> None:
    """What the lead does between sessions: the parts that came back go into .gpu-stage/."""
    st = work / ".gpu-stage"
    if st.exists():
        shutil.rmtree(st)
    st.mkdir()
    for out in outs:
        for f in out.iterdir():
            if ".part" in f.name or f.name.endswith(".manifest.json"):
                shutil.copyfile(f, st / f.name)


def test_three_sessions(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for name in ("scripts", "specbench"):
        (work / name).symlink_to(REPO / name)
    (work / "data").mkdir()
    gen = dict(GEN_ARGS=GEN, GEN_SHARD_SIZE="4", GEN_BATCH="4", GEN_MINUTES="3")

    out1 = tmp_path / "out1"
    log = step(work, tmp_path / "s1", out1, "corpus", **gen)
    assert "3/3 finished" in log and (out1 / "corpus_status.txt").is_file()
    assert any(f.name.endswith(".manifest.json") for f in out1.iterdir())

    stage(work, out1)
    root2 = tmp_path / "s2"
    log = step(work, root2, tmp_path / "x", "stage-in")
    assert "3/3 finished" in log
    out2 = tmp_path / "out2"
    log = step(work, root2, out2, "train", TRAIN_HEADS="dflash,jetspec-tree", TRAIN_ARGS=TRAIN + " --until-step 3",
               TRAIN_MINUTES="4")
    assert json.loads((root2 / "run" / "run.json").read_text())["step"] == 3
    assert {"train_report.txt", "plots.tgz", "train_log.jsonl.gz"} <= {f.name for f in out2.iterdir()}
    assert any(f.name.startswith("snapshot-tok") for f in out2.iterdir())

    stage(work, out1, out2)
    root3 = tmp_path / "s3"
    log = step(work, root3, tmp_path / "y", "stage-in")
    assert "run at step 3 of 6" in log
    assert (root3 / "run" / "snapshots").is_dir()
    out3 = tmp_path / "out3"
    step(work, root3, out3, "train", TRAIN_HEADS="dflash,jetspec-tree", TRAIN_ARGS=TRAIN, TRAIN_MINUTES="4")
    run = json.loads((root3 / "run" / "run.json").read_text())
    assert run["step"] == 6
    rows = [json.loads(line) for line in (root3 / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "kind" not in r] == [1, 2, 3, 4, 5, 6]  # the log travelled with the run
    step(work, root3, tmp_path / "out4", "heads")
    assert (tmp_path / "out4" / "heads.tar").is_file()
