"""Fixtures for the trainer tests: a tiny random target and its own greedy responses."""

from __future__ import annotations

import pytest

from specbench.models import load_target


@pytest.fixture(scope="session")
def tiny_target():
    return load_target("random:tiny-llama")


@pytest.fixture(scope="session")
def tiny_sequences(tiny_target, tmp_path_factory):
    from specbench.train.regen import regenerate, synthetic_prompt_ids

    prompts = synthetic_prompt_ids(tiny_target.config.vocab_size, 12, 4, 12, seed=0)
    return regenerate(tiny_target, prompts, tmp_path_factory.mktemp("regen"), max_new_tokens=32, batch_size=12,
                      progress=False)
