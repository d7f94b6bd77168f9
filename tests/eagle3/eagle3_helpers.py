"""Helpers of the eagle3 tests: target batches (tiny random targets: tests/targets.py)."""

from __future__ import annotations

import torch

from specbench.models.target import TargetModel
from specbench.train.objective import TargetBatch


def target_batch(target: TargetModel, sequences: list[list[int]], prompt_lens: list[int], taps) -> TargetBatch:
    """Right-padded batch with the frozen target's taps and logits (loss on the response tokens)."""
    b, t = len(sequences), max(len(s) for s in sequences)
    tokens = torch.zeros(b, t, dtype=torch.long)
    valid = torch.zeros(b, t, dtype=torch.bool)
    for i, s in enumerate(sequences):
        tokens[i, : len(s)] = torch.tensor(s)
        valid[i, : len(s)] = True
    loss_mask = valid.clone()
    for i, n in enumerate(prompt_lens):
        loss_mask[i, :n] = False
    out = target.forward(tokens, torch.arange(t).expand(b, t), target.new_cache(t, batch=b), None, tuple(taps))
    return TargetBatch(tokens=tokens, valid=valid, loss_mask=loss_mask, hidden=out.hidden, target_logits=out.logits)
