"""Helpers shared by the head tests (a module of its own: `conftest` names collide across folders)."""

from __future__ import annotations

from specbench.drafters.heads.backbone import DraftHead, HeadConfig

HEAD_KINDS = {  # drafter -> (attention, clean_next)
    "dflash": ("bidirectional", False),
    "jetspec": ("block-causal", False),
    "jetspec-tree": ("block-causal", True),
}


def random_head(target, drafter: str, *, num_layers: int = 2, block_size: int = 6, taps=(0, 1), seed: int = 0) -> DraftHead:
    attention, clean_next = HEAD_KINDS[drafter]
    cfg = HeadConfig(drafter=drafter, taps=taps, num_layers=num_layers, block_size=block_size, attention=attention,
                     clean_next=clean_next)
    return DraftHead(target.config, cfg).to(target.device).init_weights(target.model, seed=seed)
