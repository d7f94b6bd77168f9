"""The harness on the default target (SmolLM2-135M-Instruct, real tokenizer and chat template):
slow, so excluded from the default run (`pytest -m slow tests/bench`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbench.bench import DatasetSpec, Grid, Study
from specbench.bench.runner import run_study
from specbench.bench.store import read_rows


@pytest.mark.slow
def test_text_conversation_on_the_default_target(tmp_path: Path) -> None:
    """Two text turns through the chat template: greedy ngram SD emits AR's tokens on both turns, and
    the second prompt contains the first answer."""
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"id": "c", "turns": ["Name three prime numbers.", "Now add them up."]}) + "\n")
    study = Study(name="real", grids=(Grid(drafters=("ngram",), budgets=(6,)),), max_new_tokens=(24,),
                  datasets=(DatasetSpec(f"jsonl:{data}", args={"prompt_field": "turns", "id_field": "id"}),),
                  warmup_tokens=2)
    rows = read_rows(run_study(study, out_dir=tmp_path / "out", progress=False, log=lambda m: None).results)
    assert len(rows) == 4
    by = {(r["drafter"], r["turn"]): r for r in rows}
    for turn in (0, 1):
        assert by[("ngram", turn)]["output_ids"] == by[("ar", turn)]["output_ids"]
        assert by[("ar", turn)]["output_text"]
    assert by[("ar", 1)]["prompt_tokens"] > by[("ar", 0)]["prompt_tokens"] + len(by[("ar", 0)]["output_ids"]) - 2
