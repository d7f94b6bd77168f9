"""Fixtures of the eagle3 tests: a tiny random target, and a tiny eagle3 head trained on it (so that
drafts get accepted and the multi-token commit paths are exercised)."""

from __future__ import annotations

import pytest
import torch
from eagle3_helpers import target_batch
from targets import tiny_target

from specbench.models.target import TargetModel


@pytest.fixture(scope="session")
def tiny8() -> TargetModel:
    return tiny_target()


@pytest.fixture(scope="session")
def trained_tiny(tiny8):
    """(objective, loss history) after 30 Adam steps of TTT on the tiny target's own greedy answers."""
    from specbench.train.eagle3_objective import Eagle3Objective
    from specbench.engine import generate_batch
    from specbench.train.regen import synthetic_prompt_ids

    target = tiny8
    prompts = synthetic_prompt_ids(target.config.vocab_size, 12, 4, 10, seed=3)
    responses = generate_batch(target, prompts, 32)
    sequences = [p + r for p, r in zip(prompts, responses)]
    counts = torch.bincount(torch.tensor([x for s in sequences for x in s]), minlength=target.config.vocab_size)
    objective = Eagle3Objective(target, draft_vocab=64, ttt_steps=4)
    objective.prepare(counts)
    batch = target_batch(target, sequences, [len(p) for p in prompts], objective.taps)
    opt = torch.optim.AdamW(objective.head.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    history = []
    for _ in range(30):
        loss, metrics = objective.loss(batch, gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(metrics)
    return objective, history
