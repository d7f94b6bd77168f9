"""Fixtures for the jetspec++ tests: the tiny random target (two layers: tap 0 leaves layer 1 to the
training-free decoder), AR's tokens of the shared prompts, and a jetspec++ head + adapter trained on it for a few steps (so drafts get
accepted and refreshes change tokens)."""

from __future__ import annotations

import pytest
import torch

from specbench.models import load_target

from jetspecpp_helpers import NEW, PROMPTS


@pytest.fixture(scope="session")
def tiny():
    return load_target("random:tiny-llama")


@pytest.fixture(scope="session")
def ar_tokens(tiny):
    """AR's greedy tokens of PROMPTS on the tiny target (what greedy SD must emit)."""
    from specbench.engine import ar_decoder

    decoder = ar_decoder(tiny, max_seq_len=160)
    return [decoder.generate(p, NEW).tokens for p in PROMPTS]


@pytest.fixture(scope="session")
def tiny_sequences(tiny, tmp_path_factory):
    from specbench.train.regen import regenerate, synthetic_prompt_ids

    prompts = synthetic_prompt_ids(tiny.config.vocab_size, 16, 4, 12, seed=0)
    return regenerate(tiny, prompts, tmp_path_factory.mktemp("jpp_data"), max_new_tokens=40, batch_size=16,
                      progress=False)


@pytest.fixture(scope="session")
def trained_jpp(tiny, tiny_sequences, tmp_path_factory):
    """(objective, exported checkpoint directory) after 40 steps on the tiny target's own responses."""
    from specbench.train import OBJECTIVES
    from specbench.train.trainer import TrainConfig, Trainer

    work = tmp_path_factory.mktemp("jpp_run")
    obj = OBJECTIVES.build("jetspec++", tiny, num_layers=1, block_size=6, anchors=8, init_seed=1, taps=[0])
    trainer = Trainer(tiny, {"jetspec++": obj}, tiny_sequences, TrainConfig(batch_size=8, steps=40, lr=3e-3, save_every=0),
                      work)
    torch.manual_seed(0)
    trainer.train(progress=False, checkpoint=False)
    heads = trainer.export_heads(work / "heads", storage="fp32")
    return obj, heads["jetspec++"]
