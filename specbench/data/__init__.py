"""Benchmark datasets (registered by name) and the draft-head training prompts.

    load_dataset("gsm8k", data_dir="DATA_DIR", n=20)   # -> list[Prompt]
    load_dataset("jsonl:my.jsonl", prompt_field="question", id_field="qid")
    training_prompts("sharegpt", data_dir)                   # -> list[str]

A dataset entry is a function `(data_dir, **args) -> list[Prompt]`; register your own with
`@DATASETS.register("name")` or name it by dotted path ("my_pkg.my_mod:loader").
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any

from specbench.registry import Registry, RegistryError

DATASETS: Registry = Registry("dataset")
DATASETS.register("gsm8k", "specbench.data.benchmarks:gsm8k")
DATASETS.register("math500", "specbench.data.benchmarks:math500")
DATASETS.register("humaneval", "specbench.data.benchmarks:humaneval")
DATASETS.register("mbpp", "specbench.data.benchmarks:mbpp")
DATASETS.register("mt_bench", "specbench.data.benchmarks:mt_bench")
DATASETS.register("builtin", "specbench.data.benchmarks:builtin")

from specbench.data.base import DATA_ENV, DataError, Prompt, Turn, resolve_data_dir  # noqa: E402
from specbench.data.chat import turn_prompt_ids  # noqa: E402
from specbench.data.jsonl import load_jsonl_dataset  # noqa: E402
from specbench.data.training import TRAINING_SETS, training_items, training_prompts  # noqa: E402

JSONL_PREFIX = "jsonl:"


def load_dataset(name: str, data_dir: str | Path | None = None, n: int | None = None, **args: Any) -> list[Prompt]:
    """The first `n` items (all when None) of a registered dataset or of `jsonl:PATH`."""
    if n is not None and (not isinstance(n, int) or n < 1):
        raise DataError(f"dataset {name!r}: n (items to use) must be an integer >= 1 or None, got {n!r}")
    if name.startswith(JSONL_PREFIX):
        loader: Any = functools.partial(load_jsonl_dataset, name[len(JSONL_PREFIX):])
    else:
        try:
            loader = DATASETS.get(name)
        except RegistryError as exc:
            raise DataError(f"{exc}; any JSONL file works as jsonl:PATH") from None
    try:
        inspect.signature(loader).bind(data_dir, **args)
    except TypeError as exc:
        raise DataError(f"dataset {name!r} does not take the arguments {sorted(args)} ({exc})") from None
    items = loader(data_dir, **args)
    return items[:n] if n is not None else items


__all__ = ["DATASETS", "DATA_ENV", "DataError", "Prompt", "Turn", "TRAINING_SETS", "load_dataset",
           "load_jsonl_dataset", "resolve_data_dir", "training_items", "training_prompts", "turn_prompt_ids"]
