"""The results file: one JSON line per finished (configuration, item, turn), appended and fsynced at
once, so an interrupted run loses at most the line being written. A partially written last line
(a crash mid-write) is dropped when the file is opened again; a rerun skips every key it finds."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process lock
    fcntl = None  # type: ignore[assignment]

RESULTS_FILE = "results.jsonl"


class ResultsError(ValueError):
    """A results file is missing or corrupt; the message says which line."""


def results_path(path: str | Path) -> Path:
    """A results file, or a run directory holding results.jsonl."""
    p = Path(path)
    if p.is_dir():
        p = p / RESULTS_FILE
    if not p.is_file():
        raise ResultsError(f"no results at {str(path)!r}: give a results.jsonl file or the run directory "
                           f"(`specbench run` prints it, e.g. runs/quickstart)")
    return p


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of one results file (or run directory); a torn last line is ignored, a bad line elsewhere is an error."""
    p = results_path(path)
    lines = p.read_text(encoding="utf-8").split("\n")
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if lineno == len(lines):  # the unterminated tail of an interrupted write
                continue
            raise ResultsError(f"{p}:{lineno} is not valid JSON: delete that line (its item will be rerun)") from None
    return rows


def read_many(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Rows of several results files; a key seen twice keeps its last row."""
    by_key: dict[str, dict[str, Any]] = {}
    for path in paths:
        for row in read_rows(path):
            by_key[row["key"]] = row
    return list(by_key.values())


class ResultsStore:
    """Append-only writer of one run's results file. Holds an exclusive lock so two runs cannot both
    append the same items."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.path.with_name(self.path.name + ".lock"), "w")
        if fcntl is not None:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._lock.close()
                raise ResultsError(f"another run is writing {self.path}; wait for it or use another --out") from None
        self.dropped_partial_line = self._drop_partial_line()
        self.rows: dict[str, dict[str, Any]] = {r["key"]: r for r in read_rows(self.path)} if self.path.exists() else {}
        self._file = open(self.path, "a", encoding="utf-8")

    def _drop_partial_line(self) -> bool:
        """Repair an unterminated last line: complete it if it parses, drop it if it is torn."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return False
        data = self.path.read_bytes()
        if data.endswith(b"\n"):
            return False
        start = data.rfind(b"\n") + 1
        try:
            json.loads(data[start:])
        except json.JSONDecodeError:
            with open(self.path, "r+b") as f:
                f.truncate(start)
            return True
        with open(self.path, "ab") as f:
            f.write(b"\n")
        return False

    def __contains__(self, key: str) -> bool:
        return key in self.rows

    def append(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.rows[row["key"]] = row

    def close(self) -> None:
        self._file.close()
        self._lock.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
