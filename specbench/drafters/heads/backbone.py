"""The draft-head backbone shared by dflash, jetspec and jetspec-tree (docs/methods.md, "Shared pieces").

Context: the tapped target layers' outputs at each verified position are concatenated and fused,
c_i = RMSNorm(W_fc [h^l1_i; ...; h^lm_i]). Every draft layer projects the same c with its own K/V
projections (+ k-norm and RoPE at the context position) and uses the result as extra keys/values: the
context is never run through the layers, so a draft-side cache of these K/V (one entry per verified
position) is all the head keeps between rounds.

Block: the anchor followed by MASK inputs (a learned mask embedding: SmolLM2 and Llama have no mask
token, and a learned vector leaves the frozen vocabulary untouched) or concrete tokens, at positions
n .. n+b-1, run through N decoder layers of the target's family (`DecoderLayer` from the native
decoder, used here as the parameter container: attention projections, q/k norms, MLP, norms).
Output: the target's frozen LM head over the head's final RMSNorm.

The target's embedding, RoPE tables and LM head are read from the target model passed to each call,
never owned, so the head's state dict holds only trainable weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specbench.drafters.init import init_draft_params_
from specbench.drafters.heads.masks import ATTENTION_KINDS
from specbench.models.config import ModelConfig
from specbench.models.decoder import (REFERENCE_OPS, AttentionFn, AttentionMeta, DecoderLayer, KVCache, LayerOps, RMSNorm,
                                     Transformer, masked_sdpa, rope_cos_sin)


def default_taps(num_target_layers: int, count: int) -> tuple[int, ...]:
    """The DFlash rule (docs/methods.md, "Taps and fusion"): evenly spaced from layer 1 to L-3 (one
    tap: the middle). Shallow targets (tests) fall back to evenly spaced over all layers."""
    L = num_target_layers
    if count == 1:
        return (L // 2,)
    if L - 3 > 1 and count <= L - 3:
        return tuple(round(1 + i * (L - 4) / (count - 1)) for i in range(count))
    return tuple(sorted({round(i * (L - 1) / (count - 1)) for i in range(count)}))


@dataclass(frozen=True)
class HeadConfig:
    """Enough to rebuild a head for a given target (stored as JSON beside the weights).

    attention: within-block pattern the head was trained with (bidirectional | block-causal).
    clean_next: concrete (clean) block inputs were trained to predict the next token, so a pass over
    a tree's own tokens gives path-conditioned next-token distributions (jetspec-tree).
    """

    drafter: str
    taps: tuple[int, ...]
    num_layers: int = 1
    block_size: int = 16
    attention: str = "bidirectional"
    clean_next: bool = False
    train: dict[str, Any] = field(default_factory=dict)  # training settings, for the record only

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"head attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        if self.clean_next and self.attention != "block-causal":
            raise ValueError("clean_next needs block-causal attention (a bidirectional block would see the label)")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + at least one draft), got {self.block_size}")
        if self.num_layers < 1 or not self.taps:
            raise ValueError("a head needs at least one layer and one tap")
        object.__setattr__(self, "taps", tuple(int(t) for t in self.taps))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["taps"] = list(self.taps)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HeadConfig":
        known = {k: d[k] for k in ("drafter", "taps", "num_layers", "block_size", "attention", "clean_next", "train") if k in d}
        return cls(**known)


class DraftHead(nn.Module):
    """Fusion + N injected decoder layers + final norm. Trainable parameters only."""

    def __init__(self, target_config: ModelConfig, config: HeadConfig) -> None:
        super().__init__()
        cfg = target_config
        bad = [t for t in config.taps if not 0 <= t < cfg.num_layers]
        if bad:
            raise ValueError(f"taps {bad} are outside the target's {cfg.num_layers} layers")
        self.config = config
        self.target_config = cfg
        d = cfg.hidden_size
        self.fc = nn.Linear(len(config.taps) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(d))
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(config.num_layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)

    @torch.no_grad()
    def init_weights(self, target: Transformer, seed: int = 0) -> "DraftHead":
        """Normal(0, 0.02) matrices, unit norms, the final norm copied from the target's, the mask
        embedding drawn at the scale of the target's embedding rows."""
        g = init_draft_params_(self, seed)
        self.norm.weight.copy_(target.norm.weight.float())
        emb_std = float(target.embed.weight.float().std())
        self.mask_embedding.copy_(emb_std * torch.randn(self.mask_embedding.shape, generator=g))
        return self

    @torch.no_grad()
    def load_grown(self, state: dict[str, Tensor], saved_layers: int) -> None:
        """Load a trained head with fewer layers (`saved_layers`) into this deeper one, preserving its function
        (docs/training_at_scale.md, "Growing a head"): the saved layers become the first ones and every
        added layer keeps its fresh init except its two output projections (attention's wo, the MLP's w_down),
        zeroed, so the layer adds nothing to the residual stream and this head drafts exactly what the saved
        one did. Their gradients are not zero, so training moves the added layers off the identity."""
        if not 1 <= saved_layers < self.config.num_layers:
            raise ValueError(f"growing needs fewer saved layers than this head's {self.config.num_layers}, got {saved_layers}")
        added = tuple(f"layers.{i}." for i in range(saved_layers, self.config.num_layers))
        missing, unexpected = self.load_state_dict(state, strict=False)
        wrong = [k for k in missing if not k.startswith(added)]
        if wrong or unexpected:
            raise ValueError(f"the saved head is not this head with {saved_layers} layers: missing {wrong}, "
                             f"unexpected {list(unexpected)}")
        for layer in self.layers[saved_layers:]:
            layer.attn.wo.weight.zero_()
            layer.mlp.w_down.weight.zero_()

    # ---- pieces ----------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        """The head computes in its own parameter dtype (fp32 master weights when training on a bf16
        target; the target's dtype at inference): every input is cast to it."""
        return self.fc.weight.dtype

    def rope(self, positions: Tensor, target: Transformer, cache: KVCache | None = None) -> tuple[Tensor, Tensor]:
        """cos, sin [B, N, 1, D] from the target's RoPE frequencies, in the head's dtype; cache: the draft
        cache's tables (`KVCache.rope`, the same values in two gathers)."""
        return rope_cos_sin(positions, target.inv_freq, self.dtype, cache)

    def fuse(self, features: Tensor, ops: LayerOps = REFERENCE_OPS) -> Tensor:
        """features [B, C, m*d] (the taps concatenated in config order) -> c [B, C, d]."""
        return ops.norm(self.fc(features), self.hidden_norm.weight, self.hidden_norm.eps)[0]

    def context_kv(self, features: Tensor, positions: Tensor, target: Transformer, fused: bool = False,
                   rope: tuple[Tensor, Tensor] | None = None) -> list[tuple[Tensor, Tensor]]:
        """Per layer (K, V) [B, Hkv, C, D] of the context features at `positions` [B, C]. fused: inference
        through the target's layer ops (Triton kernels on CUDA, the same ops elsewhere; no autograd).
        rope: `self.rope(positions, target)` if the caller has it."""
        ops = target.ops if fused else REFERENCE_OPS
        c = self.fuse(features.to(self.dtype), ops)
        cos, sin = rope if rope is not None else self.rope(positions, target)
        return [_project_kv(layer, c, cos, sin, ops) for layer in self.layers]

    def embed_block(self, tokens: Tensor, is_mask: Tensor | None, target: Transformer) -> Tensor:
        """tokens, is_mask [B, Q] -> input embeddings [B, Q, d] (MASK rows get the mask embedding; is_mask
        None: no MASK row, the token embeddings as they are)."""
        x = target.embed(tokens).to(self.dtype)
        return x if is_mask is None else torch.where(is_mask[..., None], self.mask_embedding, x)

    def logits(self, hidden: Tensor, lm_head_weight: Tensor) -> Tensor:
        """The target's frozen LM head (weight [V, d], already in the head's dtype) on hidden [..., d]."""
        return F.linear(hidden, lm_head_weight)

    def write_context(self, features: Tensor, positions: Tensor, cache: KVCache, target: Transformer,
                      slots: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None, fused: bool = False) -> None:
        """Context K/V of features [1, C, m*d] at `positions` [1, C] into the draft cache's `slots` [1, C]
        (None: = positions; every layer; the target's qkv/RoPE op, fused on CUDA; fused: the fusion's
        norm too). No host read. rope: `self.rope(positions, target)` if the caller has it."""
        c = self.fuse(features.to(self.dtype), target.ops if fused else REFERENCE_OPS)
        cos, sin = rope if rope is not None else self.rope(positions, target, cache)
        slots = positions if slots is None else slots
        for i, layer in enumerate(self.layers):
            attn = layer.attn
            q_dim = attn.n_heads * attn.head_dim
            kv = F.linear(c, attn.wqkv.weight[q_dim:], attn.wqkv.bias[q_dim:] if attn.wqkv.bias is not None else None)
            norms = (attn.q_norm.weight, attn.k_norm.weight) if attn.k_norm is not None else (None, None)
            target.ops.qkv_rope(kv, cos, sin, 0, attn.n_kv, attn.head_dim, cache.k[i], cache.v[i], slots, *norms,
                                eps=attn.k_norm.eps if attn.k_norm is not None else 1e-6)

    def forward_cached(self, x: Tensor, positions: Tensor, cache: KVCache, meta: AttentionMeta,
                       target: Transformer, rope: tuple[Tensor, Tensor] | None = None,
                       slots: Tensor | None = None, attend: AttentionFn | None = None) -> Tensor:
        """Inference: block/tree inputs x [1, Q, d] at `positions` [1, Q] through the draft layers as
        decoder layers over the draft cache (context K/V at slots < meta.lengths; the inputs' own K/V
        written at slots lengths .. lengths+Q-1 as scratch, seen under meta.tree_mask), with the
        target's attention backend and element-wise ops. Returns the final-normed hidden [1, Q, d].
        rope: `self.rope(positions, target)`, slots: the scratch slots [1, Q] (any), if the caller has
        them; attend: another backend for `meta` (e.g. SDPA over a dense mask the caller planned)."""
        cos, sin = rope if rope is not None else self.rope(positions, target, cache)
        if slots is None:
            slots = cache.lengths[:, None] + torch.arange(x.shape[1], device=x.device)
        attend = attend if attend is not None else target.attend
        delta = None
        for i, layer in enumerate(self.layers):
            x, delta = layer.step(x, delta, cos, sin, cache.k[i], cache.v[i], slots, meta, attend, target.ops)
        return target.ops.norm(x, self.norm.weight, self.norm.eps, delta)[0]

    def forward_fused(self, x: Tensor, positions: Tensor, ctx_kv: Sequence[tuple[Tensor, Tensor]], mask: Tensor,
                      target: Transformer, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Inference `forward` (same arguments, the final-normed hidden [B, Q, d]) through the target's
        layer ops (`target.ops`, as `forward_cached`): the same ops in the same order as `forward` with the
        reference ops (the CPU), one Triton kernel each where `forward` launches several on CUDA. No
        autograd through the fused kernels: training calls `forward`."""
        b, q = x.shape[:2]
        cos, sin = rope if rope is not None else self.rope(positions, target)
        attn_mask = mask[:, None]  # [B, 1, Q, C+Q]
        slots = torch.arange(q, device=x.device).expand(b, q)  # the block's own K/V: scratch [B, Hkv, Q, D]
        meta = AttentionMeta(lengths=slots[:, 0], tree_mask=mask[:, :, -q:], kv_len=q)  # lengths 0 (a view): no context part
        delta = None
        for layer, (k_ctx, v_ctx) in zip(self.layers, ctx_kv):
            k_new = x.new_empty(b, layer.attn.n_kv, q, layer.attn.head_dim)
            v_new = torch.empty_like(k_new)

            def attend(qh: Tensor, k: Tensor, v: Tensor, _meta: AttentionMeta, scale: float,
                       k_ctx: Tensor = k_ctx, v_ctx: Tensor = v_ctx) -> Tensor:
                return masked_sdpa(qh, torch.cat([k_ctx, k], dim=2), torch.cat([v_ctx, v], dim=2), attn_mask, scale)

            x, delta = layer.step(x, delta, cos, sin, k_new, v_new, slots, meta, attend, target.ops)
        return target.ops.norm(x, self.norm.weight, self.norm.eps, delta)[0]

    def forward(self, x: Tensor, positions: Tensor, ctx_kv: Sequence[tuple[Tensor, Tensor]], mask: Tensor,
                target: Transformer, return_layers: bool = False,
                rope: tuple[Tensor, Tensor] | None = None) -> Tensor | tuple[Tensor, list[Tensor]]:
        """x [B, Q, d] block input embeddings at `positions` [B, Q]; ctx_kv from `context_kv`
        ([B, Hkv, C, D] per layer); mask [B, Q, C + Q] bool. Returns the final-normed hidden
        [B, Q, d] (and every layer's output when return_layers). rope: `self.rope(positions, target)`
        when the caller already has it (passes over the same positions)."""
        cos, sin = rope if rope is not None else self.rope(positions, target)
        attn_mask = mask[:, None]  # [B, 1, Q, C+Q]
        outputs: list[Tensor] = []
        for layer, (k_ctx, v_ctx) in zip(self.layers, ctx_kv):
            x = x + _injected_attention(layer, layer.attn_norm(x), cos, sin, k_ctx, v_ctx, attn_mask)
            x = x + layer.mlp(layer.mlp_norm(x))
            outputs.append(x)
        out = self.norm(x)
        return (out, outputs) if return_layers else out


def _projected(layer: DecoderLayer, x: Tensor, cos: Tensor, sin: Tensor,
               ops: LayerOps = REFERENCE_OPS) -> tuple[Tensor, Tensor, Tensor]:
    """The decoder's own projection (`Attention.project`: wqkv, q/k-norm, RoPE) of x [B, N, d], its K/V
    scattered into fresh scratch tensors (differentiable with the reference ops: the training pass
    backpropagates through them): q [B, H, N, D], k, v [B, Hkv, N, D]."""
    attn = layer.attn
    b, n, _ = x.shape
    alloc = x.new_zeros if ops is REFERENCE_OPS else x.new_empty  # every slot is written (slots 0..n-1)
    k = alloc(b, attn.n_kv, n, attn.head_dim)
    v = alloc(b, attn.n_kv, n, attn.head_dim)
    slots = torch.arange(n, device=x.device).expand(b, n)
    q = attn.project(x, cos, sin, k, v, slots, ops)
    return q, k, v


def _project_kv(layer: DecoderLayer, c: Tensor, cos: Tensor, sin: Tensor,
                ops: LayerOps = REFERENCE_OPS) -> tuple[Tensor, Tensor]:
    """The layer's own K/V (k-norm, RoPE) of context features c [B, C, d]: [B, Hkv, C, D] each."""
    _, k, v = _projected(layer, c, cos, sin, ops)
    return k, v


def _injected_attention(layer: DecoderLayer, h: Tensor, cos: Tensor, sin: Tensor, k_ctx: Tensor, v_ctx: Tensor,
                        attn_mask: Tensor) -> Tensor:
    """Attention of the block queries over [context K/V ; block K/V]."""
    attn = layer.attn
    b, n, _ = h.shape
    q, k, v = _projected(layer, h, cos, sin)
    keys = torch.cat([k_ctx, k], dim=2)  # [B, Hkv, C+Q, D]
    values = torch.cat([v_ctx, v], dim=2)
    y = masked_sdpa(q, keys, values, attn_mask, attn.scale)  # [B, H, Q, D]
    return attn.wo(y.transpose(1, 2).reshape(b, n, attn.n_heads * attn.head_dim))
