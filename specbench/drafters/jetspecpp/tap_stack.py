"""The state adapter's tap modules as one batched pass (the device round): on a launch-bound GPU a
one-layer module over a tree's few rows costs its kernel launches, not its FLOPs, so T taps run one
after another cost T times the launches of one. Taps with the same layer count are stacked:

    weights   every per-tap matrix and vector stacked along a leading tap dim [T, ...] (`stack_`: the
              modules' tensors become views of the stacks, so nothing is duplicated and the state
              dict, hence the checkpoint, is unchanged)
    norms     the shared part (RMSNorm with a unit weight, one fused launch over all T x Q rows) times
              each tap's weight [T, 1, d] (one element-wise launch): the reference's roundings
    products  torch.bmm / baddbmm over the tap dim (one launch each, F.linear's result per tap)
    K/V       one cache of batch T (row j: tap j's context K/V), written and read in one launch

The element-wise ops are the reference's per element and the products are F.linear's per tap, so on
the CPU the stack equals the per-tap modules (`TapAdapter.forward_cached`, `write_committed`)
exactly; a test holds it to them.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from specbench.drafters.jetspecpp.adapter import StateAdapter, TapAdapter
from specbench.models.decoder import AttentionMeta, KVCache, Transformer
from specbench.models.target import TargetModel


def stack_(tensors: Sequence[Tensor | None]) -> Tensor | None:
    """The tensors stacked along a new leading dim [T, ...], each rebound to its row of the stack (a
    view), so the stack is their only storage (one tensor: a view of it); None when they are None (a
    missing bias)."""
    if tensors[0] is None:
        return None
    if len(tensors) == 1:  # a view: nothing to rebind
        return tensors[0].detach()[None]
    with torch.no_grad(), torch.inference_mode(False):
        out = torch.stack([t.detach() for t in tensors])  # type: ignore[union-attr]
    for t, row in zip(tensors, out):
        t.data = row  # type: ignore[union-attr]
    return out


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Per tap F.linear: x [T or 1, Q, K] (1: shared by every tap), weight [T, N, K], bias [T, N] -> [T, Q, N]."""
    x = x.expand(weight.shape[0], -1, -1)
    return torch.bmm(x, weight.mT) if bias is None else torch.baddbmm(bias[:, None], x, weight.mT)


class TapWeights:
    """The stacked weights of tap modules of one layer count (module docstring): built once per module set
    and shared by every drafter over the same adapter (`StateAdapter.stacks`), since stacking rebinds
    the modules' tensors (a single module's are viewed, not rebound)."""

    def __init__(self, modules: Sequence[TapAdapter]) -> None:
        nets = [m.net for m in modules]
        counts = {n.config.num_layers for n in nets}
        if len(counts) != 1:
            raise ValueError(f"a tap stack needs one layer count per module, got {sorted(counts)}")
        self.modules, self.num_layers = list(modules), counts.pop()

        def each(get: Callable[[TapAdapter], Tensor | None]) -> Tensor | None:
            return stack_([get(m) for m in modules])

        self.fc, self.hidden_norm = each(lambda m: m.net.fc.weight), each(lambda m: m.net.hidden_norm.weight)
        self.layers = []
        for i, layer in enumerate(nets[0].layers):
            a = layer.attn
            self.layers.append({
                "attn_norm": each(lambda m: m.net.layers[i].attn_norm.weight),
                "wqkv": each(lambda m: m.net.layers[i].attn.wqkv.weight),
                "bqkv": each(lambda m: m.net.layers[i].attn.wqkv.bias),
                "q_norm": each(lambda m: m.net.layers[i].attn.q_norm.weight if a.q_norm is not None else None),
                "k_norm": each(lambda m: m.net.layers[i].attn.k_norm.weight if a.k_norm is not None else None),
                "wo": each(lambda m: m.net.layers[i].attn.wo.weight),
                "mlp_norm": each(lambda m: m.net.layers[i].mlp_norm.weight),
                "gate_up": each(lambda m: m.net.layers[i].mlp.w_gate_up.weight),
                "down": each(lambda m: m.net.layers[i].mlp.w_down.weight),
            })
        self.norm = each(lambda m: m.net.norm.weight)
        self.out_w, self.out_b = each(lambda m: m.out.weight), each(lambda m: m.out.bias)
        self.mean, self.scale = each(lambda m: m.mean), each(lambda m: m.scale)
        attn = nets[0].layers[0].attn
        self.n_heads, self.n_kv, self.head_dim, self.attn_scale = attn.n_heads, attn.n_kv, attn.head_dim, attn.scale
        self.eps = nets[0].norm.eps
        self.qk_eps = attn.q_norm.eps if attn.q_norm is not None else 1e-6

    def current(self) -> bool:
        """Whether the modules still read the stacks (a later `.to()` moves them off: stale stacks)."""
        w = self.out_w
        assert w is not None
        row = w.stride(0) * w.element_size()  # bytes between the stack's rows (no tensor op: host arithmetic)
        return all(m.out.weight.data_ptr() == w.data_ptr() + j * row for j, m in enumerate(self.modules))


class TapStack:
    """Tap modules of one layer count run as one (module docstring): their stacked weights `w` and
    `cache`, their context K/V [L, T, ...]."""

    def __init__(self, taps: Sequence[int], adapter: StateAdapter, target: TargetModel, slots: int) -> None:
        self.taps = tuple(taps)
        w = adapter.stacks.get(self.taps)
        if w is None or not w.current():
            w = adapter.stacks[self.taps] = TapWeights([adapter.tap(t) for t in taps])
        self.w: TapWeights = w
        if w.fc.dtype != target.dtype:  # type: ignore[union-attr]
            raise ValueError(f"the adapter computes in {w.fc.dtype}, the target in {target.dtype}: move it first")  # type: ignore[union-attr]
        cfg = target.config
        self.cache = KVCache(w.num_layers, len(taps), cfg.num_kv_heads, slots, cfg.head_dim, target.dtype, target.device)
        self.ones = torch.ones(cfg.hidden_size, dtype=target.dtype, device=target.device)  # the norms' shared part

    @property
    def size(self) -> int:
        return len(self.taps)

    def check(self) -> None:
        """The modules still read the stacks (`TapWeights.current`)."""
        if not self.w.current():
            raise RuntimeError("the adapter's weights moved after they were stacked (adapter.to() after begin()?): "
                               "build the drafter's device states again (begin a new request)")

    def reset(self) -> None:
        self.cache.reset()

    def _norm(self, x: Tensor, weight: Tensor, model: Transformer, delta: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(RMSNorm(x + delta) * weight[tap], x + delta) for x, delta [T, Q, d]."""
        normed, x = model.ops.norm(x, self.ones, self.w.eps, delta)
        return weight[:, None] * normed, x

    def _qkv_rope(self, p: dict[str, Tensor | None], qkv: Tensor, cos: Tensor, sin: Tensor, slots: Tensor,
                  n_heads: int, k_cache: Tensor, v_cache: Tensor, model: Transformer) -> Tensor | None:
        """A layer's (weights p) q/k-norm, RoPE and K/V into its caches [T, Hkv, S, D] for every tap of qkv
        [T, Q, W]: one launch, or one per tap where the taps' q/k-norm weights differ (the kernel takes one)."""
        t = qkv.shape[0]
        cos, sin, slots = cos.expand(t, -1, -1, -1), sin.expand(t, -1, -1, -1), slots.expand(t, -1)
        if p["k_norm"] is None:
            return model.ops.qkv_rope(qkv, cos, sin, n_heads, self.w.n_kv, self.w.head_dim, k_cache, v_cache, slots,
                                      None, None, eps=self.w.qk_eps)
        qs = [model.ops.qkv_rope(qkv[j: j + 1], cos[j: j + 1], sin[j: j + 1], n_heads, self.w.n_kv, self.w.head_dim,
                                 k_cache[j: j + 1], v_cache[j: j + 1], slots[j: j + 1], p["q_norm"][j], p["k_norm"][j],
                                 eps=self.w.qk_eps) for j in range(t)]
        return torch.cat(qs) if n_heads > 0 else None  # type: ignore[arg-type]

    def write(self, features: Tensor, count: Tensor, rope: tuple[Tensor, Tensor], slots: Tensor,
              model: Transformer) -> None:
        """`write_committed` for every tap: features [T, P, d] (tap j's states of the next P committed
        positions, the first count [1] real) at the slots [1, P] = their positions (cos/sin `rope`
        there), then every length += count."""
        self.check()
        c, _ = self._norm(linear(features.to(self.w.fc.dtype), self.w.fc, None), self.w.hidden_norm, model)  # type: ignore[union-attr,arg-type]
        q_dim = self.w.n_heads * self.w.head_dim
        for i, p in enumerate(self.w.layers):
            bias = p["bqkv"][:, q_dim:] if p["bqkv"] is not None else None
            self._qkv_rope(p, linear(c, p["wqkv"][:, q_dim:], bias), *rope, slots, 0, self.cache.k[i], self.cache.v[i],
                           model)
        self.cache.lengths += count

    def block(self, tokens: Tensor, rope: tuple[Tensor, Tensor], slots: Tensor, meta: AttentionMeta,
              model: Transformer, rows: slice = slice(None)) -> Tensor:
        """The predicted states [T', Q, d] of block rows `tokens` [Q] by the taps `rows` (all: T' = T;
        `TapAdapter.forward_cached`): cos/sin `rope` at their positions, their own K/V at cache slots
        [1, Q] (scratch), `meta` over those cache rows (batch T')."""
        self.check()
        sel = lambda w: w[rows] if w is not None else None  # noqa: E731  # the taps read (views)
        t, q = len(range(self.size)[rows]), tokens.shape[0]
        k_cache, v_cache = self.cache.k[:, rows], self.cache.v[:, rows]
        x, delta = model.embed(tokens.expand(t, q)).to(self.w.fc.dtype), None  # type: ignore[union-attr]  # [T', Q, d]
        for i, layer in enumerate(self.w.layers):
            p = {name: sel(w) for name, w in layer.items()}
            h, x = self._norm(x, p["attn_norm"], model, delta)
            qh = self._qkv_rope(p, linear(h, p["wqkv"], p["bqkv"]), *rope, slots, self.w.n_heads, k_cache[i], v_cache[i],
                                model)
            y = model.attend(qh, k_cache[i], v_cache[i], meta, self.w.attn_scale)  # [T', H, Q, D]
            a = linear(y.transpose(1, 2).reshape(t, q, self.w.n_heads * self.w.head_dim), p["wo"], None)
            h, x = self._norm(x, p["mlp_norm"], model, a)
            delta = linear(model.ops.silu_mul(linear(h, p["gate_up"], None)), p["down"], None)
        h, _ = self._norm(x, sel(self.w.norm), model, delta)  # type: ignore[arg-type]
        return sel(self.w.mean)[:, None] + sel(self.w.scale)[:, None] * linear(h, sel(self.w.out_w), sel(self.w.out_b))  # type: ignore[index,arg-type]
