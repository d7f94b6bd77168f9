"""A bool attention mask packed into the tree-attention kernel's int32 words in one launch.

The reference (`masks.pack_tree_mask`, the CPU path) is tensor ops: a pad, the bit values, a shift, a where and a
sum over each word's 32 keys, about five kernels. Every forward of the target on the `triton` backends packs its
tree mask once (the AR step's one-node mask included), so on a launch-bound GPU those launches sit in every verify
pass and every AR step. Here one program per (tree, tile of rows) loads its rows' keys word by word and writes
the words: bit j % 32 of word j // 32 of row i is mask[i, j], the same int32 values as the reference (a sum of
distinct bits, bit 31 the value -2**31, is their OR). Any strides (the causal default is an expanded view).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device
from specbench.kernels.masks import BITS, num_words, pack_tree_mask

TILE = 4096  # mask entries a program loads at once (rows x words x 32)


@triton.jit
def _pack_bits_kernel(Mask, Out, N, M, W, stride_mb, stride_mn, stride_mm, stride_ob, stride_on,
                      ROWS: tl.constexpr, WORDS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)  # [R]
    row_ok = rows < N
    bit = tl.arange(0, 32)  # [32]
    value = tl.full([32], 1, tl.int32) << bit  # bit 31: -2**31
    mask_row = Mask + b * stride_mb + rows.to(tl.int64)[:, None, None] * stride_mn  # [R, 1, 1]
    for w0 in range(0, W, WORDS):
        w = w0 + tl.arange(0, WORDS)  # [Wt]
        col = w[:, None] * 32 + bit[None, :]  # [Wt, 32] key index
        ok = row_ok[:, None, None] & (col < M)[None, :, :]  # [R, Wt, 32]
        seen = tl.load(mask_row + col[None, :, :].to(tl.int64) * stride_mm, mask=ok, other=0)  # [R, Wt, 32] uint8
        word = tl.sum(tl.where(seen != 0, value[None, None, :], 0), axis=2)  # [R, Wt] int32
        tl.store(Out + b * stride_ob + rows[:, None] * stride_on + w[None, :], word,
                 mask=row_ok[:, None] & (w < W)[None, :])


def pack_tree_mask_kernel(mask: Tensor) -> Tensor:
    """[..., N, M] bool -> [..., N, ceil(M / 32)] int32, as `masks.pack_tree_mask` (same values) in one launch."""
    require_kernel_device(mask)
    if mask.dtype != torch.bool or mask.dim() < 2:
        raise ValueError(f"the mask must be a bool tensor [..., N, M], got {mask.dtype} {tuple(mask.shape)}")
    n, m = mask.shape[-2:]
    w = num_words(m)
    flat = mask.reshape(-1, n, m).view(torch.uint8)  # [B, N, M]: a view where the strides allow (expanded ones too)
    out = torch.empty(flat.shape[0], n, w, dtype=torch.int32, device=mask.device)  # [B, N, W]
    if out.numel():
        words = min(triton.next_power_of_2(w), TILE // BITS)
        rows = max(1, min(triton.next_power_of_2(n), TILE // (BITS * words)))
        _pack_bits_kernel[(flat.shape[0], triton.cdiv(n, rows))](
            flat, out, n, m, w, flat.stride(0), flat.stride(1), flat.stride(2), out.stride(0), out.stride(1),
            ROWS=rows, WORDS=words, num_warps=4)
    return out.reshape(*mask.shape[:-1], w)


def pack_bits(mask: Tensor) -> Tensor:
    """`masks.pack_tree_mask`'s words: one launch where the mask is on CUDA, the tensor ops elsewhere (the CPU)."""
    return pack_tree_mask_kernel(mask) if mask.is_cuda else pack_tree_mask(mask)
