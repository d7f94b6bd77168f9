"""scripts/bundle.py: a directory cut into parts, sent over several size-limited folders, staged over
several calls, comes back byte for byte; a corrupt or missing part extracts nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bundle.py"


def bundle(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_parts_travel_and_reassemble(tmp_path: Path) -> None:
    src = tmp_path / "run"
    (src / "sub").mkdir(parents=True)
    blob = os.urandom(2_500_000)
    (src / "sub" / "state.bin").write_bytes(blob)
    (src / "log.txt").write_text("hello\n")
    assert bundle("pack", "run-7", "run", "--spool", "spool", "--chunk-mib", "1", cwd=tmp_path).returncode == 0
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    out1.mkdir()
    (out1 / "report.txt").write_text("x")  # already in $OUT: counts against the limits
    r = bundle("send", "--spool", "spool", "--to", str(out1), "--max-files", "3", "--max-mib", "8", cwd=tmp_path)
    assert r.returncode == 0 and "2 part(s) still" in r.stdout  # 3 parts of 1 MiB
    assert len(list(out1.iterdir())) == 3  # report + manifest + one part
    assert bundle("send", "--spool", "spool", "--to", str(out2), cwd=tmp_path).returncode == 0
    assert not (tmp_path / "spool" / "run-7").exists()
    dest = tmp_path / "dest"
    first = bundle("unpack", str(out1), "--to", str(dest), cwd=tmp_path)  # staged in a first call: incomplete
    assert first.returncode == 3 and not (dest / "run").exists()
    part = next(out2.glob("*.part*"))
    good = part.read_bytes()
    part.write_bytes(bytes([good[0] ^ 0xFF]) + good[1:])  # a byte that surely differs
    assert bundle("unpack", str(out2), "--to", str(dest), cwd=tmp_path).returncode == 3  # corrupt: nothing
    assert not (dest / "run").exists()
    part.write_bytes(good)
    assert bundle("unpack", str(out2), "--to", str(dest), cwd=tmp_path).returncode == 0
    assert (dest / "run" / "sub" / "state.bin").read_bytes() == blob
    assert (dest / "run" / "log.txt").read_text() == "hello\n"
