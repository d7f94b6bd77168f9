"""Fixtures for the DFlash-family heads: a tiny random target, random heads, and heads trained for a
few steps on it (so that drafts get accepted and commit paths are exercised)."""

from __future__ import annotations

import pytest
import torch

from specbench.models import load_target

from head_helpers import HEAD_KINDS


@pytest.fixture(scope="session")
def tiny():
    return load_target("random:tiny-llama")


@pytest.fixture(scope="session")
def trained_tiny_heads(tiny, tmp_path_factory):
    """The three heads trained together for a few steps on the tiny target's own greedy responses."""
    from specbench.train import OBJECTIVES
    from specbench.train.regen import regenerate, synthetic_prompt_ids
    from specbench.train.trainer import TrainConfig, Trainer

    work = tmp_path_factory.mktemp("tiny_heads")
    prompts = synthetic_prompt_ids(tiny.config.vocab_size, 16, 4, 12, seed=0)
    seqs = regenerate(tiny, prompts, work / "data", max_new_tokens=40, batch_size=16, progress=False)
    objectives = {n: OBJECTIVES.build(n, tiny, num_layers=1, block_size=6, anchors=8, init_seed=1) for n in HEAD_KINDS}
    trainer = Trainer(tiny, objectives, seqs, TrainConfig(batch_size=8, steps=25, lr=3e-3, save_every=0), work / "run")
    torch.manual_seed(0)
    trainer.train(progress=False, checkpoint=False)
    return {n: o.head for n, o in objectives.items()}
