"""Tiny random targets shared by the test folders (tests/ is on sys.path: its conftest lives there)."""

from __future__ import annotations

import torch

from specbench.models.config import PRESETS
from specbench.models.loader import build_model
from specbench.models.target import TargetModel


def tiny_target(num_layers: int = 8, seed: int = 1, preset: str = "tiny-llama", sharpen: float = 40.0) -> TargetModel:
    """A random tiny target with enough layers for distinct low/mid/high EAGLE-3 taps. Its LM head is
    scaled by `sharpen` so that next-token laws are peaked like a real model's (random init is near uniform)."""
    cfg = PRESETS[preset].replace(num_layers=num_layers)
    model = build_model(cfg, None, dtype=torch.float32, device="cpu", seed=seed)
    model.lm_head.weight.mul_(sharpen)
    return TargetModel(name=f"random:{preset}-{num_layers}L@{seed}", model=model, tokenizer=None,
                       fingerprint=f"test-{preset}-{num_layers}-{seed}")
