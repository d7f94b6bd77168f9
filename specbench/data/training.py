"""Training prompts for draft heads (never the evaluation items): GSM8K train, the MBPP training
tasks (task_id 1..10 and 511..974) and the ShareGPT first user turns. The trainer regenerates the
responses with the target itself, so only the prompts are needed.

Every prompt has a stable id "<set>:<key>" (GSM8K train: the 0-based line index; MBPP: the task_id;
ShareGPT: the record's id), so a corpus of generated responses can say which prompt each came from."""

from __future__ import annotations

from pathlib import Path

from specbench.data.base import DataError, data_file, field_of, read_jsonl
from specbench.data.benchmarks import MBPP_TEST_IDS, mbpp_prompt, mbpp_records

TRAINING_SETS = ("gsm8k_train", "mbpp_train", "sharegpt")


def gsm8k_train_items(data_dir: str | Path | None = None) -> list[tuple[str, str]]:
    path = data_file(data_dir, "gsm8k_train.jsonl", "gsm8k_train", "GSM8K train, openai/grade-school-math train.jsonl")
    return [(f"gsm8k_train:{i}", field_of(r, "question", f"{path}:{n}")) for i, (n, r) in enumerate(read_jsonl(path))]


def mbpp_train_items(data_dir: str | Path | None = None) -> list[tuple[str, str]]:
    """MBPP outside the test split (task_id 1..10 and 511..974), posed like the test items."""
    return [(f"mbpp_train:{task_id}", mbpp_prompt(r, r["_where"])) for task_id, r in mbpp_records(data_dir, "mbpp_train")
            if task_id not in MBPP_TEST_IDS]


def sharegpt_items(data_dir: str | Path | None = None) -> list[tuple[str, str]]:
    path = data_file(data_dir, "sharegpt_prompts.jsonl", "sharegpt", "ShareGPT first user turns (id, prompt)")
    return [(f"sharegpt:{field_of(r, 'id', f'{path}:{n}')}", field_of(r, "prompt", f"{path}:{n}"))
            for n, r in read_jsonl(path)]


def training_items(name: str, data_dir: str | Path | None = None) -> list[tuple[str, str]]:
    """(id, text) of every prompt of one training set (see TRAINING_SETS), in file order."""
    loaders = {"gsm8k_train": gsm8k_train_items, "mbpp_train": mbpp_train_items, "sharegpt": sharegpt_items}
    if name not in loaders:
        raise DataError(f"unknown training set {name!r}; training sets: {', '.join(TRAINING_SETS)}")
    return loaders[name](data_dir)


def training_prompts(name: str, data_dir: str | Path | None = None) -> list[str]:
    """The prompts of one training set (see TRAINING_SETS), in file order."""
    return [text for _, text in training_items(name, data_dir)]
