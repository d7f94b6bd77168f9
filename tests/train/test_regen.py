"""Batched regeneration emits what plain AR greedy decoding emits, row by row, and resumes."""

from __future__ import annotations

import json

from specbench.engine import ar_decoder
from specbench.engine import generate_batch
from specbench.train.regen import DATA_FILE, load_sequences, regenerate, synthetic_prompt_ids


def test_batched_generation_equals_ar_greedy(tiny_target) -> None:
    prompts = synthetic_prompt_ids(tiny_target.config.vocab_size, 5, 2, 15, seed=3)
    assert len({len(p) for p in prompts}) > 1, "rows of different lengths are the point"
    batched = generate_batch(tiny_target, prompts, 20)
    decoder = ar_decoder(tiny_target, max_seq_len=64)
    for p, got in zip(prompts, batched):
        assert got == decoder.generate(p, 20).tokens


def test_regeneration_resumes_and_skips_done_prompts(tiny_target, tmp_path) -> None:
    prompts = synthetic_prompt_ids(tiny_target.config.vocab_size, 6, 3, 8, seed=1)
    first = regenerate(tiny_target, prompts[:4], tmp_path, max_new_tokens=8, batch_size=2, progress=False)
    assert len(first) == 4
    with open(tmp_path / DATA_FILE, "a") as f:
        f.write('{"key": 5, "prom')  # a line cut by an interruption
    again = regenerate(tiny_target, prompts, tmp_path, max_new_tokens=8, batch_size=2, progress=False)
    assert [s.prompt for s in again] == [list(p) for p in prompts]
    keys = [json.loads(line)["key"] for line in (tmp_path / DATA_FILE).read_text().splitlines()]
    assert sorted(keys) == list(range(6)) and len(keys) == 6  # nothing generated twice
    assert [s.response for s in again[:4]] == [s.response for s in first]
    assert load_sequences(tmp_path)[4].response == generate_batch(tiny_target, [prompts[4]], 8)[0]


def test_regeneration_stops_at_the_deadline(tiny_target, tmp_path) -> None:
    prompts = synthetic_prompt_ids(tiny_target.config.vocab_size, 4, 3, 8, seed=2)
    assert regenerate(tiny_target, prompts, tmp_path, max_new_tokens=8, batch_size=2, deadline=0.0, progress=False) == []
