"""Shared initialisation of trainable draft heads."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def init_draft_params_(module: nn.Module, seed: int) -> torch.Generator:
    """Normal(0, 0.02) matrices, zero biases, unit 1-D weights (norms), from a seeded CPU generator so a
    head's starting point does not depend on the device it is built on. Returns the generator, for
    any further draws a head makes."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in module.named_parameters():
        if name.endswith("bias"):
            vals = torch.zeros(p.shape)
        elif p.ndim == 1:
            vals = torch.ones(p.shape)
        else:
            vals = 0.02 * torch.randn(p.shape, generator=g)
        p.copy_(vals.to(p.dtype))
    return g
