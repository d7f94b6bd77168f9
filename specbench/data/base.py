"""What a benchmark item is, where the data files live, and how they are read.

Benchmark files are never part of the repository: they are read from a data directory named by
`data_dir=` (the CLI's `--data-dir`; `specbench train --data`) or `$SPECBENCH_DATA`. Every missing piece is an error that says
which file is needed, where it was looked for and how to point specbench at it.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Union

from specbench.config import ConfigError

DATA_ENV = "SPECBENCH_DATA"

#: A user turn: text (formatted with the target's chat template) or token ids (used as they are,
#: for targets without a tokenizer, e.g. random test targets).
Turn = Union[str, tuple[int, ...]]


class DataError(ConfigError):
    """A dataset cannot be found or read; the message says what to do (naming `data_dir` as a key)."""


@dataclass(frozen=True)
class Prompt:
    """One benchmark item. Several turns make a conversation: turn k is asked after the model's own
    answers to turns 0..k-1 (MT-Bench)."""

    id: str
    turns: tuple[Turn, ...]
    system: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.turns:
            raise DataError(f"prompt {self.id!r} has no turns")
        kinds = {isinstance(t, str) for t in self.turns}
        if len(kinds) > 1:
            raise DataError(f"prompt {self.id!r} mixes text turns and token-id turns; use one kind")

    @property
    def is_text(self) -> bool:
        return isinstance(self.turns[0], str)


def resolve_data_dir(data_dir: str | Path | None, needed_for: str) -> Path:
    """The data directory: `data_dir`, else $SPECBENCH_DATA; an error naming both if neither is set."""
    chosen = data_dir if data_dir is not None else os.environ.get(DATA_ENV) or None
    if chosen is None:
        raise DataError(
            f"{needed_for} is read from a data directory, and none was given: pass data_dir=DIR "
            f"or set {DATA_ENV}=DIR, where DIR holds the benchmark files "
            f"(gsm8k_test.jsonl, math500.jsonl, humaneval.jsonl.gz, mbpp.jsonl, mt_bench_question.jsonl, ...). "
            f"Without one, use the datasets that ship with specbench: 'builtin' or 'humaneval'", keys=("data_dir",))
    path = Path(chosen).expanduser()
    if not path.is_dir():
        source = "data_dir" if data_dir is not None else f"${DATA_ENV}"
        raise DataError(f"data directory {str(path)!r} (from {source}) does not exist; point {source} at the "
                        f"directory that holds the benchmark files", keys=("data_dir",))
    return path


def data_file(data_dir: str | Path | None, filename: str, dataset: str, source: str) -> Path:
    """`filename` inside the data directory, or an error saying where to put it and where it comes from."""
    directory = resolve_data_dir(data_dir, f"dataset {dataset!r} ({filename})")
    path = directory / filename
    if not path.is_file():
        raise DataError(f"dataset {dataset!r} needs {filename} in the data directory {str(directory)!r}, which "
                        f"lacks it: put the file there (it is {source}) or point data_dir / ${DATA_ENV} at a "
                        f"directory that has it", keys=("data_dir",))
    return path


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for every non-blank line; `.gz` files are decompressed."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno} is not valid JSON ({exc.msg}); fix or remove that line") from None
            if not isinstance(record, dict):
                raise DataError(f"{path}:{lineno} holds a {type(record).__name__}, not a JSON object")
            yield lineno, record


def field_of(record: Mapping[str, Any], name: str, where: str) -> Any:
    """record[name], or an error naming the file position and the fields that do exist."""
    if name not in record:
        raise DataError(f"{where} has no field {name!r}; its fields are {sorted(record)}")
    return record[name]
