"""Helpers of the jetspec++ tests (a module of its own: `conftest` names collide across folders)."""

from __future__ import annotations

import torch

from specbench.config import SamplingConfig
from specbench.drafters.base import DraftState
from specbench.drafters.heads.backbone import DraftHead, HeadConfig
from specbench.drafters.jetspecpp.adapter import AdapterConfig, StateAdapter
from specbench.models.config import ModelConfig
from specbench.models.loader import build_model
from specbench.models.target import TargetModel
from specbench.verify.base import TorchRandomness

PROMPTS = [[5, 17, 33, 2, 90, 41], [88, 3, 14, 15, 92, 65, 35, 89, 79]]  # decoded on the tiny target
NEW = 32  # tokens per request
GRID = [(j, r, rep) for j in range(4) for r in range(j + 1) for rep in ((True, False) if r else (True,))]  # (J, R, replace)


def random_parts(target: TargetModel, taps=(0,), block_size: int = 6, adapter_layers: int = 1, seed: int = 0,
                 attention: str = "block-causal") -> tuple[DraftHead, StateAdapter]:
    """An untrained jetspec++ draft head and adapter (read-outs perturbed so predictions vary)."""
    cfg = HeadConfig(drafter="jetspec++", taps=taps, num_layers=1, block_size=block_size, attention=attention)
    head = DraftHead(target.config, cfg).to(target.device).init_weights(target.model, seed=seed)
    adapter = StateAdapter(target.config, AdapterConfig(taps=taps, layers=(adapter_layers,) * len(taps),
                                                        block_size=block_size)).to(target.device)
    adapter.init_weights(target.model, seed=seed)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for t in taps:
            out = adapter.tap(t).out
            out.weight.copy_(0.3 * torch.randn(out.weight.shape, generator=g))
    return head, adapter


def tiny_exact_target(vocab: int = 5, seed: int = 0) -> TargetModel:
    """A float64 two-layer target over a tiny vocabulary (exact-law tests; layer 1 is the decoder's)."""
    cfg = ModelConfig("llama", vocab, 16, 32, 2, 2, 1, 8, max_position_embeddings=64)
    model = build_model(cfg, None, dtype=torch.float64, device="cpu", seed=seed)
    for layer in model.layers:  # sharper attention and spread logits: varied next-token laws
        layer.attn.wqkv.weight.mul_(10.0)
        layer.attn.wo.weight.mul_(50.0)
    model.lm_head.weight.mul_(10.0)
    return TargetModel(name=f"tiny-exact-{seed}", model=model, tokenizer=None, fingerprint="test")


def begun(target: TargetModel, drafter, prompt: list[int], anchor: int) -> DraftState:  # type: ignore[no-untyped-def]
    """A request begun on `drafter` (prefill of `prompt`, then `anchor`) outside the decode loop."""
    n = len(prompt)
    prefill = target.forward(torch.tensor([prompt]), torch.arange(n)[None], target.new_cache(64), None, drafter.taps)
    state = DraftState(tokens=prompt + [anchor], prompt_len=n, sampling=SamplingConfig(), draft_rng=TorchRandomness(0))
    drafter.begin(state, prefill, 64)
    return state
