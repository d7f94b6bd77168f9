"""`jsonl:PATH`: any JSONL (or .jsonl.gz) file as a dataset, with a field mapping.

The prompt field may hold text, a list of texts (a multi-turn conversation), a list of token ids
(a pre-tokenised prompt, for targets without a tokenizer) or a list of such lists. `template`
builds the text from several fields instead, e.g. template="{text}\\n\\nTests:\\n{tests}".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specbench.data.base import DATA_ENV, DataError, Prompt, Turn, field_of, read_jsonl


def locate(path: str | Path, data_dir: str | Path | None) -> Path:
    """`path` as given (absolute or relative to the working directory), else inside the data directory."""
    candidate = Path(path).expanduser()
    if candidate.is_file():
        return candidate
    directory = data_dir if data_dir is not None else os.environ.get(DATA_ENV) or None
    if directory is not None and not candidate.is_absolute() and (Path(directory) / candidate).is_file():
        return Path(directory) / candidate
    where = f" or in the data directory {str(directory)!r}" if directory is not None else ""
    raise DataError(f"jsonl dataset file {str(path)!r} does not exist (looked relative to {os.getcwd()!r}{where})")


def as_turns(value: Any, where: str) -> tuple[Turn, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return tuple(value)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return (tuple(value),)
        if all(isinstance(v, list) and v and all(isinstance(t, int) for t in v) for v in value):
            return tuple(tuple(v) for v in value)
    raise DataError(f"{where}: a prompt must be text, a list of texts (turns), a list of token ids or a list of "
                    f"token-id lists; got {str(value)[:80]!r}")


def load_jsonl_dataset(path: str | Path, data_dir: str | Path | None = None, *, prompt_field: str = "prompt",
                       id_field: str | None = None, template: str | None = None,
                       system_field: str | None = None) -> list[Prompt]:
    """One Prompt per record. id = record[id_field], or the 0-based record index when id_field is None."""
    file = locate(path, data_dir)
    out = []
    for index, (lineno, record) in enumerate(read_jsonl(file)):
        where = f"{file}:{lineno}"
        if template is not None:
            try:
                turns: tuple[Turn, ...] = (template.format(**record),)
            except KeyError as exc:
                raise DataError(f"{where}: template {template!r} names field {exc.args[0]!r}, which the record "
                                f"lacks; its fields are {sorted(record)}") from None
        else:
            turns = as_turns(field_of(record, prompt_field, where), where)
        item_id = str(field_of(record, id_field, where)) if id_field is not None else str(index)
        system = field_of(record, system_field, where) if system_field is not None else None
        out.append(Prompt(id=item_id, turns=turns, system=system))
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        raise DataError(f"{file}: ids from field {id_field!r} are not unique; choose another id_field")
    return out
