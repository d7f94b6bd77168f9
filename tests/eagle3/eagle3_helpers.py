"""Helpers of the eagle3 tests: tiny random targets and target batches."""

from __future__ import annotations

import torch

from specbench.models.config import PRESETS
from specbench.models.loader import build_model
from specbench.models.target import TargetModel
from specbench.train.objective import TargetBatch


def tiny_target(num_layers: int = 8, seed: int = 1, preset: str = "tiny-llama", sharpen: float = 40.0) -> TargetModel:
    """A random tiny target with enough layers for distinct low/mid/high EAGLE-3 taps. Its LM head is
    scaled by `sharpen` so that next-token laws are peaked like a real model's (random init is near uniform)."""
    cfg = PRESETS[preset].replace(num_layers=num_layers)
    model = build_model(cfg, None, dtype=torch.float32, device="cpu", seed=seed)
    model.lm_head.weight.mul_(sharpen)
    return TargetModel(name=f"random:{preset}-{num_layers}L@{seed}", model=model, tokenizer=None,
                       fingerprint=f"test-{preset}-{num_layers}-{seed}")


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
