"""The inputs of one EAGLE-3 head pass over F new draft nodes, in one launch (eagle3's `run_nodes`).

A head pass over a depth's frontier starts from each node's token embedding and its parent's hidden row,
each RMS-normed by its own weight and concatenated, and records which draft rows the node sees (its
parent's rows plus itself, as packed bits for the tree-attention kernel). In tensor ops that is seven
launches a pass (embedding, the parents' hidden rows, two norms, the concatenation, the parents' bits,
the or with the node's own bit), each a ~3-5 us graph node of a launch-bound round: 49 a round under
EAGLE-2's defaults (7 depths), 105 for a 16-node chain. One program per node does them all:

  x[i]      = [RMSNorm_e(embed[tokens[i]]), RMSNorm_h(hidden_rows[parent_rows[i]])]   [F, 2d]
  hidden[i] = hidden_rows[parent_rows[i]]                                               [F, d]
  bits[first + i] = bits[parent_rows[i]] | own_bits[first + i]                          [W] words

The norms round as `kernels.fused.rmsnorm` does (fp32 statistics, the normed row cast back to the
stream's dtype before the weight). The parents are earlier rows than first .. first + F - 1, so the bits
a program reads are never the ones another writes.
Reference: `drafters.eagle3.drafter.node_inputs_ops`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device


@triton.jit
def _normed(row, W, ok, n_cols, eps):
    """RMSNorm(row) * W in fp32 (row in its own dtype; the normed row rounded to it before the weight)."""
    xf = row.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    w = tl.load(W + tl.arange(0, row.shape[0]), mask=ok, other=0.0)
    return w.to(tl.float32) * (xf * inv).to(row.dtype).to(tl.float32)


@triton.jit
def _node_inputs_kernel(Tokens, ParentRows, Embed, HiddenRows, EmbedNormW, HiddenNormW, Bits, OwnBits, X, Hidden,
                        D, NW, FIRST, eps, stride_tokens, stride_embed, stride_hidden_rows, stride_bits,
                        BLOCK: tl.constexpr, BLOCK_W: tl.constexpr):
    i = tl.program_id(0)
    token = tl.load(Tokens + i * stride_tokens).to(tl.int64)
    parent = tl.load(ParentRows + i).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    emb = tl.load(Embed + token * stride_embed + cols, mask=ok, other=0.0)
    hid = tl.load(HiddenRows + parent * stride_hidden_rows + cols, mask=ok, other=0.0)
    out = X + i.to(tl.int64) * 2 * D
    tl.store(out + cols, _normed(emb, EmbedNormW, ok, D, eps).to(X.dtype.element_ty), mask=ok)
    tl.store(out + D + cols, _normed(hid, HiddenNormW, ok, D, eps).to(X.dtype.element_ty), mask=ok)
    tl.store(Hidden + i.to(tl.int64) * D + cols, hid, mask=ok)
    w = tl.arange(0, BLOCK_W)
    w_ok = w < NW
    row = FIRST + i
    seen = tl.load(Bits + parent * stride_bits + w, mask=w_ok, other=0) | tl.load(OwnBits + row * stride_bits + w,
                                                                                    mask=w_ok, other=0)
    tl.store(Bits + row * stride_bits + w, seen, mask=w_ok)


def node_inputs(tokens: Tensor, parent_rows: Tensor, embed: Tensor, hidden_rows: Tensor, embed_norm: Tensor,
                hidden_norm: Tensor, eps: float, bits: Tensor, own_bits: Tensor, first: int) -> tuple[Tensor, Tensor]:
    """tokens [F] (target ids), parent_rows [F] (int64 rows of hidden_rows [R, d] and bits [R, W] int32),
    embed [V, d] the target's embedding, the two norm weights [d]: returns (x [F, 2d], the parents' hidden
    rows [F, d]) in hidden_rows' dtype and writes bits[first + i] = bits[parent_rows[i]] | own_bits[first + i]."""
    require_kernel_device(tokens)
    f, d = tokens.numel(), hidden_rows.shape[-1]
    if tokens.dim() != 1 or parent_rows.shape != tokens.shape or embed.shape[-1] != d or bits.shape != own_bits.shape:
        raise ValueError(f"node_inputs: tokens {tuple(tokens.shape)}, parent_rows {tuple(parent_rows.shape)}, embed "
                         f"{tuple(embed.shape)}, hidden_rows {tuple(hidden_rows.shape)}, bits {tuple(bits.shape)}, "
                         f"own_bits {tuple(own_bits.shape)}")
    if embed.dtype != hidden_rows.dtype:
        raise ValueError(f"node_inputs: the embedding ({embed.dtype}) and the hidden rows ({hidden_rows.dtype}) differ")
    if not (0 < first and first + f <= bits.shape[0]):
        raise ValueError(f"node_inputs: rows {first}..{first + f - 1} outside the {bits.shape[0]} rows of the bits")
    if embed.stride(-1) != 1 or hidden_rows.stride(-1) != 1 or bits.stride(-1) != 1 or own_bits.stride() != bits.stride():
        raise ValueError("node_inputs: embed, hidden_rows and bits need unit column strides (own_bits the bits' layout)")
    x = torch.empty(f, 2 * d, dtype=hidden_rows.dtype, device=tokens.device)
    hidden = torch.empty(f, d, dtype=hidden_rows.dtype, device=tokens.device)
    block = triton.next_power_of_2(d)
    _node_inputs_kernel[(f,)](tokens, parent_rows.contiguous(), embed, hidden_rows, embed_norm, hidden_norm, bits,
                              own_bits, x, hidden, d, bits.shape[-1], first, eps, tokens.stride(0), embed.stride(0),
                              hidden_rows.stride(0), bits.stride(0), BLOCK=block,
                              BLOCK_W=max(2, triton.next_power_of_2(bits.shape[-1])), num_warps=4 if block <= 2048 else 8)
    return x, hidden
