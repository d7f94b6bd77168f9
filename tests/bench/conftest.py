"""Fixtures for the harness tests: a pre-tokenised dataset and a study on a tiny random target."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from specbench.bench import DatasetSpec, Grid, Study


@pytest.fixture(autouse=True)
def one_torch_thread():  # type: ignore[no-untyped-def]
    """Tiny models run fastest on one thread, and the test machine's cores are shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def ids_dataset(tmp_path: Path) -> Path:
    """Four token-id prompts for random:tiny-llama (vocab 96); the first has two turns."""
    rng = random.Random(0)
    rows = [{"qid": "two-turn", "ids": [[rng.randrange(96) for _ in range(12)], [rng.randrange(96) for _ in range(5)]]}]
    rows += [{"qid": f"p{i}", "ids": [rng.randrange(96) for _ in range(16)]} for i in range(3)]
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def tiny_study(ids_dataset: Path) -> Study:
    return Study(name="tiny", targets=("random:tiny-llama",), max_seq_len=128, max_new_tokens=(12,), warmup_tokens=2,
                 grids=(Grid(drafters=("ngram", "self"), budgets=(3,)),),
                 datasets=(DatasetSpec(f"jsonl:{ids_dataset}", args={"prompt_field": "ids", "id_field": "qid"}),))
