"""Pure-PyTorch references of the Triton kernels, with the same arguments, for tests and benchmarks.

They favour obviousness over speed: dense masks, float64 softmax, a Python walk over the tree.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.kernels.masks import unpack_tree_mask


def _masked_attention(q: Tensor, keys: Tensor, values: Tensor, visible: Tensor, scale: float) -> Tensor:
    """q [H, N, D], keys/values [Hkv, T, D], visible [N, T] bool -> [H, N, D]; a row that sees no key is 0."""
    group = q.shape[0] // keys.shape[0]
    keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
    scores = (q @ keys.transpose(-1, -2)) * scale  # [H, N, T]
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all -inf row -> NaN -> 0
    return probs @ values


def context_attention_reference(q: Tensor, ctx_k: Tensor, ctx_v: Tensor, ctx_lengths: Tensor, new_k: Tensor,
                                new_v: Tensor, mask_bits: Tensor, scale: float, *, new_after_context: bool = False,
                                num_new: int | None = None, dtype: torch.dtype = torch.float64) -> Tensor:
    """Row b's query i sees context keys [0, ctx_lengths[b]) and new key j < num_new (default N) iff bit j
    of mask row i.
    New key j sits at slot j of new_k, or at slot ctx_lengths[b] + j when new_after_context (the
    target's cache, where new_k is the cache itself). Returns [B, H, N, D] in `dtype`."""
    b_size, _, n, _ = q.shape
    nk = n if num_new is None else num_new
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    for b in range(b_size):
        c = int(ctx_lengths[b])
        off = c if new_after_context else 0
        keys = torch.cat([ctx_k[b, :, :c], new_k[b, :, off:off + nk]], dim=1).to(dtype)  # [Hkv, C+NK, D]
        values = torch.cat([ctx_v[b, :, :c], new_v[b, :, off:off + nk]], dim=1).to(dtype)
        visible = torch.cat([torch.ones(n, c, dtype=torch.bool, device=q.device), unpack_tree_mask(mask_bits[b], nk)], 1)
        out[b] = _masked_attention(q[b].to(dtype), keys, values, visible, scale)
    return out


def tree_attention_reference(q: Tensor, k_cache: Tensor, v_cache: Tensor, lengths: Tensor, tree_bits: Tensor,
                             scale: float, *, dtype: torch.dtype = torch.float64) -> Tensor:
    """The target's verification attention: prefix [0, len) of the cache plus the N tree keys at
    slots [len, len + N) under the packed ancestor mask. Returns [B, H, N, D] in `dtype`."""
    return context_attention_reference(q, k_cache, v_cache, lengths, k_cache, v_cache, tree_bits, scale,
                                       new_after_context=True, dtype=dtype)


def tree_accept_reference(tokens: Tensor, parents: Tensor, picks: Tensor) -> Tensor:
    """The walk of verify/walk.py: from the root, descend into the first child (lowest id) whose token
    is the node's pick (its argmax for greedy). Returns the kernel's packed layout [B, 2 + N] int64
    (or [2 + N] for 1-D inputs): (path length P, bonus token, path node ids root->node, -1 padding)."""
    squeeze = tokens.dim() == 1
    tok, par, pk = (t.reshape(-1, t.shape[-1]).tolist() for t in (tokens, parents, picks))
    rows = []
    for tk, pr, a in zip(tok, par, pk):
        n = len(tk)
        children: list[list[int]] = [[] for _ in range(n)]
        for i in range(1, n):
            if pr[i] >= 0:  # parentless non-root nodes are padding
                children[pr[i]].append(i)
        node, path = 0, [0]
        while True:
            nxt = next((c for c in children[node] if tk[c] == a[node]), None)
            if nxt is None:
                break
            node = nxt
            path.append(node)
        rows.append([len(path), a[node]] + path + [-1] * (n - len(path)))
    out = torch.tensor(rows, dtype=torch.int64, device=tokens.device)
    return out[0] if squeeze else out


def kv_compact_reference(k: Tensor, v: Tensor, path: Tensor, base: Tensor) -> None:
    """In place: for each row b, the K/V of slots base[b] + path[b, p] move to base[b] + p in every
    layer and head (k, v [L, B, Hkv, S, D]; path [B, P] increasing node ids, -1 = padding)."""
    for b in range(path.shape[0]):
        p = path[b][path[b] >= 0].to(torch.long)
        src = int(base[b]) + p
        dst = int(base[b]) + torch.arange(p.numel(), device=k.device)
        for buf in (k, v):
            buf[:, b].index_copy_(2, dst, buf[:, b].index_select(2, src))


def rmsnorm_reference(x: Tensor, weight: Tensor, eps: float, delta: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(RMSNorm(x + delta) * weight, x + delta): the residual add in x's dtype, the norm in fp32, cast back
    to x's dtype before the weight (what `specbench.models.decoder.RMSNorm` does)."""
    if delta is not None:
        x = x + delta
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * normed, x


def qkv_rope_reference(qkv: Tensor, cos: Tensor, sin: Tensor, n_heads: int, n_kv: int, head_dim: int, k_cache: Tensor,
                       v_cache: Tensor, slots: Tensor, q_norm: Tensor | None = None, k_norm: Tensor | None = None,
                       eps: float = 1e-6) -> Tensor | None:
    """`specbench.kernels.fused.qkv_rope` in plain ops: split, per-head RMSNorm, rotate-half RoPE, K/V
    scattered into the caches at `slots` [B, N]; returns q [B, H, N, D] (None when n_heads == 0)."""
    b, n, _ = qkv.shape
    q, k, v = qkv.split([n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], dim=-1)
    q = q.reshape(b, n, n_heads, head_dim)
    k = k.reshape(b, n, n_kv, head_dim)
    v = v.reshape(b, n, n_kv, head_dim)
    cos, sin = cos.reshape(b, n, 1, head_dim), sin.reshape(b, n, 1, head_dim)

    def norm(x: Tensor, w: Tensor | None) -> Tensor:
        return x if w is None else rmsnorm_reference(x, w, eps)[0]

    def rope(x: Tensor) -> Tensor:
        half = head_dim // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return (x * cos + rotated * sin).to(x.dtype)

    k = rope(norm(k, k_norm))
    index = slots[:, None, :, None].expand(b, n_kv, n, head_dim)
    k_cache.scatter_(2, index, k.transpose(1, 2).to(k_cache.dtype))
    v_cache.scatter_(2, index, v.transpose(1, 2).to(v_cache.dtype))
    return rope(norm(q, q_norm)).transpose(1, 2) if n_heads > 0 else None


def add_rmsnorm_qkv_rope_reference(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                                   bias: Tensor | None, cos: Tensor, sin: Tensor, n_heads: int, n_kv: int,
                                   head_dim: int, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
                                   q_norm: Tensor | None = None, k_norm: Tensor | None = None,
                                   qk_eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """`specbench.kernels.qkv_rope_linear.add_rmsnorm_qkv_rope` in plain ops: (q [B, H, N, D], x + delta);
    K/V into the caches at `slots`."""
    qkv, resid = add_rmsnorm_linear_reference(x, delta, norm_weight, eps, weight, bias)
    q = qkv_rope_reference(qkv, cos, sin, n_heads, n_kv, head_dim, k_cache, v_cache, slots, q_norm, k_norm, qk_eps)
    return q, resid


def silu_mul_reference(gate_up: Tensor) -> Tensor:
    """gate_up [..., 2I] -> silu(gate) * up [..., I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def add_rmsnorm_linear_reference(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                                 bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`specbench.kernels.norm_linear.add_rmsnorm_linear` as the composition it fuses: (F.linear(RMSNorm(x + delta)
    * norm_weight, weight, bias), x + delta)."""
    h, resid = rmsnorm_reference(x, norm_weight, eps, delta)
    return torch.nn.functional.linear(h, weight, bias), resid


def silu_mul_linear_reference(gate_up: Tensor, weight: Tensor) -> Tensor:
    """`specbench.kernels.norm_linear.silu_mul_linear` as its composition: F.linear(silu(gate) * up, weight)."""
    return torch.nn.functional.linear(silu_mul_reference(gate_up), weight)


def add_rmsnorm_mlp_reference(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, gate_up_weight: Tensor,
                              down_weight: Tensor) -> tuple[Tensor, Tensor]:
    """`specbench.kernels.norm_linear.add_rmsnorm_mlp` as its composition: (down(silu(gate) * up) of the gate/up
    product of RMSNorm(x + delta) * norm_weight, x + delta)."""
    gate_up, resid = add_rmsnorm_linear_reference(x, delta, norm_weight, eps, gate_up_weight)
    return silu_mul_linear_reference(gate_up, down_weight), resid


def output_linear_reference(o: Tensor, weight: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """(stream, pending) after a block's output product: the stream x as it is and the product F.linear(o, weight),
    its residual add left to the norm after it (`LayerOps.output_linear`)."""
    return x, torch.nn.functional.linear(o, weight)


def linear_residual_reference(a: Tensor, weight: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """`specbench.kernels.norm_stats.linear_residual` with the row sums of squares whole: (x + F.linear(a, weight),
    sum of its squares per row [M] float32), the product rounded to the dtype before the add."""
    out = (x.float() + torch.nn.functional.linear(a, weight).float()).to(x.dtype)
    return out, out.float().pow(2).sum(-1).reshape(-1)


def gate_up_silu_scaled_reference(x: Tensor, row_sumsq: Tensor, eps: float, folded_gate_up: Tensor) -> Tensor:
    """silu(gate) * up of [gate | up] = (x @ W'.T) / rms(x): W' the gate/up weight with the norm weight folded in,
    rms from the rows' sums of squares [M] (the fp32 product, scaled, rounded once; then as `silu_mul_reference`)."""
    k = x.shape[-1]
    inv = torch.rsqrt(row_sumsq.reshape(*x.shape[:-1], 1) / k + eps)
    gate_up = ((x.float() @ folded_gate_up.float().T) * inv).to(x.dtype)
    return silu_mul_reference(gate_up)


def ranked_topk_reference(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`ranked_topk_triton`: (values [R, k] float32 as stored, ids [R, k] int64) of each row of x [R, V] by
    (value desc, id asc), -0.0 equal to +0.0: one stable sort of the whole row."""
    x = x.float()
    ids = torch.sort(x + 0.0, dim=-1, descending=True, stable=True).indices[:, :k]
    return x.gather(-1, ids), ids


def forward_kl_rows_reference(student: Tensor, teacher: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """`kl_loss.forward_kl_rows`: (KL(softmax(teacher / T) || softmax(student / T)) [M], lse_q [M], lse_p [M]),
    in float64 and returned as float32; a teacher entry of -inf adds nothing."""
    s, p = student.double() / temperature, teacher.double() / temperature
    lse_q, lse_p = torch.logsumexp(s, -1), torch.logsumexp(p, -1)
    prob = (p - lse_p[:, None]).exp()
    kl = torch.where(prob > 0, prob * ((p - lse_p[:, None]) - (s - lse_q[:, None])), 0.0).sum(-1)
    return kl.float(), lse_q.float(), lse_p.float()


def forward_kl_rows_grad_reference(student: Tensor, teacher: Tensor, grad_rows: Tensor, temperature: float = 1.0) -> Tensor:
    """`kl_loss.forward_kl_rows_grad`: grad_rows[r] * (softmax(s / T) - softmax(p / T)) / T, in the student's dtype."""
    s, p = student.double() / temperature, teacher.double() / temperature
    diff = torch.softmax(s, -1) - torch.softmax(p, -1)
    return (grad_rows.double()[:, None] * diff / temperature).to(student.dtype)
