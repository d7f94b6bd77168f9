"""The EAGLE-3 draft head: one decoder layer over [token embedding ; fused low/mid/high target features],
its own final norm and LM head over a reduced draft vocabulary (`d2t` maps draft ids to target ids).

Tap convention. EAGLE-3 reads the *inputs* of target layers 2, L//2 and L-3 (Hugging Face
`hidden_states[2]`, `[L//2]`, `[L-3]`). specbench's tap l is the *output* of decoder layer l, so the
same tensors are taps 1, L//2 - 1 and L - 4 (`eagle3_feature_layers`).

The layer is the target family's own building blocks (RMSNorm, RoPE, `Attention`, `MLP` from
specbench.models.decoder); only the q/k/v projection is widened to read the 2d-wide input. The head
takes embeddings as input: the target's embedding table is frozen and never part of the head.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor, nn

from specbench.drafters.init import init_draft_params_
from specbench.models.config import ModelConfig
from specbench.models.decoder import (MLP, REFERENCE_OPS, Attention, AttentionFn, AttentionMeta, LayerOps, RMSNorm, Transformer,
                                      rope_inv_freq)


def _norm(ops: LayerOps, norm: RMSNorm, x: Tensor) -> Tensor:
    return ops.norm(x, norm.weight, norm.eps, None)[0]


def _doubled(inv_freq: Tensor) -> Tensor:
    """[D] fp32: the inverse frequencies twice (rotate-half pairs dim j with j + D/2), so the angles of
    both halves come from one product instead of a product and a concatenation (the same values)."""
    return torch.cat([inv_freq, inv_freq]).float()


def eagle3_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """Target taps (low, mid, high) = outputs of layers 1, L//2 - 1, L - 4 = inputs of layers 2, L//2,
    L - 3. Clamped into [0, L - 1] so tiny test targets (L < 5) still get three features."""
    low, mid, high = (min(max(x, 0), num_layers - 1) for x in (1, num_layers // 2 - 1, num_layers - 4))
    return low, mid, high


def select_draft_vocab(token_counts: Tensor, size: int) -> Tensor:
    """d2t [size] int64: the `size` most frequent target ids (ties: lower id), in increasing id order,
    so an argmax over the draft vocabulary breaks ties towards the lower target id like the target's."""
    counts = torch.as_tensor(token_counts).flatten().to("cpu", torch.float64)
    if not 1 <= size <= counts.numel():
        raise ValueError(f"draft vocabulary size must be in [1, {counts.numel()}], got {size}")
    order = torch.sort(-counts, stable=True).indices[:size]
    return order.sort().values


def target_to_draft(d2t: Tensor, vocab_size: int) -> Tensor:
    """t2d [vocab_size] int64: the draft id of each target id, -1 for ids outside the draft vocabulary."""
    t2d = torch.full((vocab_size,), -1, dtype=torch.long, device=d2t.device)
    t2d[d2t] = torch.arange(d2t.numel(), device=d2t.device)
    return t2d


class FusedInputAttention(Attention):
    """The target family's attention block with q/k/v read from the 2d-wide [embedding ; hidden] input;
    output (wo) stays d-wide."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.wqkv = nn.Linear(2 * cfg.hidden_size, qkv, bias=cfg.qkv_bias)


class Eagle3Head(nn.Module):
    """fc: fused target features -> d; one decoder layer whose residual stream is the fed-back hidden;
    norm + lm_head over the draft vocabulary. Buffer d2t [K] (persistent: it travels in the checkpoint)."""

    def __init__(self, cfg: ModelConfig, feature_layers: Sequence[int], draft_vocab: int) -> None:
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        if not feature_layers or any(not 0 <= layer < cfg.num_layers for layer in feature_layers):
            raise ValueError(f"feature_layers {list(feature_layers)} must be target layers in [0, {cfg.num_layers})")
        if not 1 <= draft_vocab <= cfg.vocab_size:
            raise ValueError(f"draft_vocab must be in [1, {cfg.vocab_size}] (the target's vocabulary), got {draft_vocab}")
        self.config = cfg
        self.feature_layers = tuple(int(x) for x in feature_layers)
        self.fc = nn.Linear(len(self.feature_layers) * d, d, bias=False)
        self.embed_norm = RMSNorm(d, eps)
        self.hidden_norm = RMSNorm(d, eps)
        self.attn = FusedInputAttention(cfg)
        self.mlp_norm = RMSNorm(d, eps)
        self.mlp = MLP(cfg)
        self.norm = RMSNorm(d, eps)
        self.lm_head = nn.Linear(d, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.arange(draft_vocab, dtype=torch.long))
        self.register_buffer("rope_freq", _doubled(rope_inv_freq(cfg)), persistent=False)

    @torch.no_grad()
    def init_weights(self, target: Transformer, seed: int = 0) -> "Eagle3Head":
        """Normal(0, 0.02) matrices, zero biases, unit norms; then the LM head rows and the final norm
        copied from the target's (rows d2t), which starts training from the target's own readout."""
        init_draft_params_(self, seed)
        self.lm_head.weight.copy_(target.lm_head.weight[self.d2t.to(target.lm_head.weight.device)].to(self.lm_head.weight))
        self.norm.weight.copy_(target.norm.weight.to(self.norm.weight))
        return self

    def cast(self, device: torch.device | str, dtype: torch.dtype) -> "Eagle3Head":
        """Move to the target's device and dtype; the RoPE frequencies stay fp32 (a bf16 copy would
        shift the angles at long positions away from what the head was trained with)."""
        self.to(device=device, dtype=dtype)
        self.rope_freq = _doubled(rope_inv_freq(self.config)).to(device)
        return self

    @property
    def draft_vocab(self) -> int:
        return int(self.d2t.numel())

    def head_config(self) -> dict[str, Any]:
        """What `from_config` needs to rebuild this head."""
        return {"drafter": "eagle3", "feature_layers": list(self.feature_layers), "draft_vocab": self.draft_vocab}

    @classmethod
    def from_config(cls, cfg: ModelConfig, config: dict[str, Any]) -> "Eagle3Head":
        try:
            return cls(cfg, config["feature_layers"], int(config["draft_vocab"]))
        except KeyError as exc:
            raise ValueError(f"eagle3 head config lacks {exc}; it was not saved by the eagle3 objective") from None

    def set_draft_vocab(self, d2t: Tensor) -> None:
        """Install a draft-id -> target-id map of the head's size (strictly increasing target ids)."""
        d2t = torch.as_tensor(d2t, dtype=torch.long).to(self.d2t.device)
        if d2t.shape != self.d2t.shape:
            raise ValueError(f"d2t has shape {tuple(d2t.shape)}, the head's draft vocabulary is {tuple(self.d2t.shape)}")
        if bool((d2t[1:] <= d2t[:-1]).any()) or int(d2t[0]) < 0 or int(d2t[-1]) >= self.config.vocab_size:
            raise ValueError("d2t must hold strictly increasing target ids in [0, vocab_size)")
        self.d2t.copy_(d2t)

    def fuse(self, features: Tensor) -> Tensor:
        """[..., F*d] concatenated target taps (in `feature_layers` order) -> [..., d]."""
        return self.fc(features.to(self.fc.weight.dtype))

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions [B, N] -> cos, sin [B, N, 1, D] in the head's dtype (computed in fp32)."""
        freq = self.rope_freq
        # integer positions * fp32 frequencies: promoted to fp32 inside the product (one kernel, the values
        # of converting first); a frequency table cast to another dtype keeps the fp32 positions of before
        promotes = freq.dtype == torch.float32 and not positions.is_floating_point()
        pos = positions[..., None] if promotes else positions[..., None].float()
        emb = (pos * freq)[:, :, None, :]  # [B, N, 1, D]: both halves at once
        dtype = self.fc.weight.dtype
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, embeds: Tensor, hidden: Tensor, positions: Tensor, k_cache: Tensor, v_cache: Tensor,
                slots: Tensor, meta: AttentionMeta | None, attend: AttentionFn, ops: LayerOps = REFERENCE_OPS) -> Tensor:
        """One layer pass. embeds [B, N, d] (embedding of each entry's token), hidden [B, N, d] (fused
        target feature, or the head's own previous output); K/V are written to `slots` [B, N] of the
        one-layer caches [B, Hkv, S, D] and `attend` decides what each entry sees. Returns the new
        hidden [B, N, d] (pre-norm: it is what gets fed back)."""
        x, delta = self.step(embeds, hidden, self.rope(positions), k_cache, v_cache, slots, meta, attend, ops)
        return x + delta

    def step(self, embeds: Tensor, hidden: Tensor, rope: tuple[Tensor, Tensor], k_cache: Tensor, v_cache: Tensor,
             slots: Tensor, meta: AttentionMeta | None, attend: AttentionFn, ops: LayerOps = REFERENCE_OPS
             ) -> tuple[Tensor, Tensor]:
        """`forward` with the RoPE tables given (cos, sin [B, N, 1, D], e.g. rows of a table computed once
        per round) and the new hidden returned as (x, delta) with x + delta unsummed, so the caller fuses
        the add into the final norm (`logits_and_hidden`)."""
        hidden = hidden.to(self.fc.weight.dtype)
        return self.step_normed(self.node_input(embeds, hidden, ops), hidden, rope, k_cache, v_cache, slots, meta,
                                attend, ops)

    def node_input(self, embeds: Tensor, hidden: Tensor, ops: LayerOps = REFERENCE_OPS) -> Tensor:
        """The layer's input [..., 2d]: the token embeddings and the hidden rows [..., d], each RMS-normed by
        its own weight, concatenated (in the head's dtype)."""
        dtype = self.fc.weight.dtype
        return torch.cat([_norm(ops, self.embed_norm, embeds.to(dtype)), _norm(ops, self.hidden_norm, hidden.to(dtype))],
                         dim=-1)

    def step_normed(self, x: Tensor, hidden: Tensor, rope: tuple[Tensor, Tensor], k_cache: Tensor, v_cache: Tensor,
                    slots: Tensor, meta: AttentionMeta | None, attend: AttentionFn, ops: LayerOps = REFERENCE_OPS
                    ) -> tuple[Tensor, Tensor]:
        """`step` from its normed input x [B, N, 2d] (the two norms concatenated) and hidden [B, N, d] in the
        head's dtype: where a kernel built both (`kernels.node_inputs`)."""
        cos, sin = rope
        a = self.attn(x, cos, sin, k_cache, v_cache, slots, meta, attend, ops)  # type: ignore[arg-type]
        normed, h = ops.norm(hidden, self.mlp_norm.weight, self.mlp_norm.eps, a)  # h = hidden + attention
        return h, self.mlp(normed, ops)

    def logits_and_hidden(self, x: Tensor, delta: Tensor, ops: LayerOps = REFERENCE_OPS) -> tuple[Tensor, Tensor]:
        """(logits [..., K], hidden = x + delta [..., d]) from `step`'s output: the residual add, the final
        norm and the LM head as the target's last layer runs them (`add_rmsnorm_linear`)."""
        return ops.add_rmsnorm_linear(x, delta, self.norm.weight, self.norm.eps, self.lm_head.weight, None)

    def logits(self, hidden: Tensor, ops: LayerOps = REFERENCE_OPS) -> Tensor:
        """[..., d] -> draft-vocabulary logits [..., K]."""
        return self.lm_head(_norm(ops, self.norm, hidden))
