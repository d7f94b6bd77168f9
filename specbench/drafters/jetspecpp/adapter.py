"""The state adapter (methods.md §5.1 item 4): for every tapped target layer l, a small module that
attends to the verified prefix states h^l_{<n} and predicts the states h^l of the block's positions
n .. n+b-1 given the block's tokens (anchor + drafts).

Each tap's module is a KV-injection block model, the draft head's backbone (`DraftHead`, one tap):
the prefix states are fused (W_fc, RMSNorm) and projected by every layer's own K/V; the block's
token embeddings (the target's frozen embedding) are the queries, block-causal (the target's state at
n+j depends on tokens up to n+j only). A linear read-out maps the final hidden to the state space as
h_hat = mu + sigma * out(y): mu and sigma are the per-dimension mean and standard deviation of the
tap's states on the first training batch (buffers), so the read-out starts at the mean state and
learns in units of each dimension's spread; residual streams carry dimensions far larger than the
rest, which a plain linear read-out trained at draft-head learning rates would take ~1e5 steps to reach.

The paper's adapter for Qwen3-8B uses 1/1/1/4/5 layers on taps (1, 9, 17, 25, 33); the exact
architecture is unpublished [INFERRED here].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from specbench.drafters.heads.backbone import DraftHead, HeadConfig
from specbench.models.config import ModelConfig
from specbench.models.decoder import AttentionFn, AttentionMeta, KVCache, Transformer
from specbench.models.target import TargetModel


@dataclass(frozen=True)
class AdapterConfig:
    """taps: the target layers predicted (those the draft head reads); layers: per tap, how many
    injected decoder layers; block_size: the block the adapter was trained on."""

    taps: tuple[int, ...]
    layers: tuple[int, ...]
    block_size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "taps", tuple(int(t) for t in self.taps))
        object.__setattr__(self, "layers", tuple(int(n) for n in self.layers))
        if not self.taps or len(self.layers) != len(self.taps):
            raise ValueError(f"adapter layers {list(self.layers)} must give one count per tap {list(self.taps)}")
        if min(self.layers) < 1:
            raise ValueError(f"every adapter module needs >= 1 layer, got {list(self.layers)}")

    def to_dict(self) -> dict[str, Any]:
        return {"taps": list(self.taps), "layers": list(self.layers), "block_size": self.block_size}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AdapterConfig":
        return cls(taps=tuple(d["taps"]), layers=tuple(d["layers"]), block_size=int(d["block_size"]))


def per_tap_layers(layers: int | Sequence[int], taps: Sequence[int]) -> tuple[int, ...]:
    """One count for every tap (an int applies to all), e.g. [1, 1, 2] for three taps."""
    if isinstance(layers, int):
        return (layers,) * len(taps)
    out = tuple(int(n) for n in layers)
    if len(out) != len(taps):
        raise ValueError(f"adapter_layers {list(out)} must give one count per tap {list(taps)} (or one int for all)")
    return out


class TapAdapter(nn.Module):
    """One tap's predictor: block tokens + prefix states of that tap -> predicted block states."""

    def __init__(self, target_config: ModelConfig, tap: int, num_layers: int, block_size: int) -> None:
        super().__init__()
        d = target_config.hidden_size
        self.net = DraftHead(target_config, HeadConfig(drafter="jetspec++/adapter", taps=(tap,), num_layers=num_layers,
                                                       block_size=block_size, attention="block-causal"))
        self.out = nn.Linear(d, d, bias=True)
        self.register_buffer("mean", torch.zeros(d))
        self.register_buffer("scale", torch.ones(d))
        self.register_buffer("stats_ready", torch.zeros((), dtype=torch.bool))

    @torch.no_grad()
    def set_stats(self, states: Tensor) -> None:
        """mu, sigma per dimension from sample states [M, d]."""
        s = states.float()
        self.mean.copy_(s.mean(0).to(self.mean.dtype))
        self.scale.copy_(s.std(0).clamp_min(1e-6).to(self.scale.dtype))
        self.stats_ready.fill_(True)

    def context_kv(self, states: Tensor, positions: Tensor, model: Transformer, fused: bool = False,
                   rope: tuple[Tensor, Tensor] | None = None) -> list[tuple[Tensor, Tensor]]:
        """Per layer (K, V) of the prefix states [B, C, d] at positions [B, C] (fused, rope: `DraftHead.context_kv`'s)."""
        return self.net.context_kv(states, positions, model, fused, rope)

    def forward(self, tokens: Tensor, positions: Tensor, ctx_kv: Sequence[tuple[Tensor, Tensor]], mask: Tensor,
                model: Transformer, rope: tuple[Tensor, Tensor] | None = None, fused: bool = False) -> Tensor:
        """tokens, positions [B, Q]; mask [B, Q, C + Q] (context ; block) -> predicted states [B, Q, d]
        (rope: `net.rope(positions, model)` if the caller has it; fused: inference through the target's
        layer ops, `DraftHead.forward_fused`)."""
        x = self.net.embed_block(tokens, None, model)
        y = self.net.forward_fused(x, positions, ctx_kv, mask, model, rope) if fused else \
            self.net(x, positions, ctx_kv, mask, model, rope=rope)
        return self.mean + self.scale * self.out(y)

    def forward_cached(self, tokens: Tensor, positions: Tensor, cache: KVCache, meta: AttentionMeta,
                       model: Transformer, rope: tuple[Tensor, Tensor] | None = None, slots: Tensor | None = None,
                       attend: AttentionFn | None = None) -> Tensor:
        """`forward` against a context cache written by `write_committed` (the device round): tokens,
        positions [1, Q]; meta over the cache (block K/V in the scratch slots past its length) ->
        predicted states [1, Q, d]. No host read. rope, slots, attend: `DraftHead.forward_cached`'s."""
        x = self.net.embed_block(tokens, None, model)
        y = self.net.forward_cached(x, positions, cache, meta, model, rope, slots, attend)
        return self.mean + self.scale * self.out(y)


class StateAdapter(nn.Module):
    """One `TapAdapter` per tapped layer."""

    def __init__(self, target_config: ModelConfig, config: AdapterConfig) -> None:
        super().__init__()
        bad = [t for t in config.taps if not 0 <= t < target_config.num_layers]
        if bad:
            raise ValueError(f"adapter taps {bad} are outside the target's {target_config.num_layers} layers")
        self.config = config
        self.stacks: dict[tuple[int, ...], Any] = {}  # tap_stack.TapWeights per tap group: derived, not in the state dict
        self.modules_by_tap = nn.ModuleDict({str(t): TapAdapter(target_config, t, n, config.block_size)
                                             for t, n in zip(config.taps, config.layers)})

    def tap(self, layer: int) -> TapAdapter:
        return self.modules_by_tap[str(layer)]  # type: ignore[return-value]

    @torch.no_grad()
    def init_weights(self, target: Transformer, seed: int = 0) -> "StateAdapter":
        """Each tap's backbone as a draft head's (`DraftHead.init_weights`), read-outs at zero (the
        prediction starts at the mean state)."""
        for i, t in enumerate(self.config.taps):
            m = self.tap(t)
            m.net.init_weights(target, seed=seed + 1 + i)
            m.out.weight.zero_()
            m.out.bias.zero_()
        return self


class ContextCache:
    """Per-layer K/V of one injection module's context (the verified prefix), each committed position
    written once; block K/V are never kept (methods.md §1.3)."""

    def __init__(self, module: TapAdapter, target: TargetModel, max_seq_len: int) -> None:
        cfg = target.config
        self.module, self.model = module, target.model
        self.cache = KVCache(module.net.config.num_layers, 1, cfg.num_kv_heads, max_seq_len, cfg.head_dim,
                             target.dtype, target.device)

    @property
    def length(self) -> int:
        return self.cache.host_lengths[0]

    def reset(self) -> None:
        self.cache.reset()

    def extend(self, states: Tensor) -> None:
        """Append committed positions' states [1, k, d]."""
        start, k = self.length, states.shape[1]
        if k == 0:
            return
        positions = torch.arange(start, start + k, device=states.device)[None]
        for i, (key, value) in enumerate(self.module.context_kv(states, positions, self.model)):
            self.cache.k[i, :, :, start: start + k] = key
            self.cache.v[i, :, :, start: start + k] = value
        self.cache.advance(k)

    def kv(self) -> list[tuple[Tensor, Tensor]]:
        n = self.length
        return [(self.cache.k[i, :, :, :n], self.cache.v[i, :, :, :n]) for i in range(self.cache.k.shape[0])]
