"""`specbench train` end to end on a tiny random target: trains, exports loadable heads, resumes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specbench.train.cli import main, parse_head_args

ARGS = ["train", "--drafter", "dflash,jetspec-tree", "--target", "random:tiny-llama", "--synthetic-prompts", "6",
        "--max-new-tokens", "12", "--batch-size", "3", "--head-arg", "block_size=4", "--head-arg", "anchors=3",
        "--quiet"]


def test_train_exports_heads_and_resumes(tmp_path, capsys) -> None:
    from specbench.drafters.heads.parallel import DFlashDrafter
    from specbench.models import load_target

    assert main(ARGS + ["--out", str(tmp_path), "--steps", "2"]) == 0
    assert (tmp_path / "heads" / "dflash" / "head.safetensors").is_file()
    DFlashDrafter(load_target("random:tiny-llama"), checkpoint=str(tmp_path / "heads" / "dflash"))
    assert main(ARGS + ["--out", str(tmp_path), "--steps", "3"]) == 0
    assert "resumed at step 2" in capsys.readouterr().err


def test_head_args_are_parsed_per_head() -> None:
    got = parse_head_args(["block_size=8", "jetspec:losses={fkl: 1}"], ["dflash", "jetspec"])
    assert got == {"dflash": {"block_size": 8}, "jetspec": {"block_size": 8, "losses": {"fkl": 1}}}
    with pytest.raises(ValueError, match="not among the heads"):
        parse_head_args(["eagle3:x=1"], ["dflash"])


@pytest.mark.slow
def test_gpu_script_dry_run(tmp_path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "train_heads_gpu.py"
    res = subprocess.run([sys.executable, str(script), "--device", "cpu", "--target", "random:tiny-llama", "--dry-run",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert {"dflash.tar", "jetspec.tar", "jetspec-tree.tar", "summary.json", "train_log.jsonl"} <= set(files)
    assert len(files) <= 8 and all(p.stat().st_size <= 16 * 2**20 for p in tmp_path.iterdir())
