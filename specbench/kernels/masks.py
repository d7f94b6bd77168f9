"""Packed attention masks for the tree-attention kernel (pure PyTorch, no Triton needed).

A mask over N new keys is stored as int32 words, 32 keys per word: bit (j % 32) of word j // 32 in row i
says whether query i sees new key j. This is N*N/8 bytes instead of the dense [N, kv_len] mask, and it
is built once per forward and shared by every layer. A tree's ancestor mask (`ancestor_masks`) is the
unpacked mask such a forward starts from; `ancestor_mask.py` builds it in one launch on CUDA.
"""

from __future__ import annotations

import torch
from torch import Tensor

BITS = 32


def num_words(n: int) -> int:
    return (n + BITS - 1) // BITS


def pack_tree_mask(mask: Tensor) -> Tensor:
    """[..., N, M] bool -> [..., N, ceil(M / 32)] int32 (runs on the mask's device, no host sync). M = N for a
    tree's ancestor mask; M > N when N queries see M new keys."""
    if mask.dtype != torch.bool or mask.dim() < 2:
        raise ValueError(f"the mask must be a bool tensor [..., N, M], got {mask.dtype} {tuple(mask.shape)}")
    n = mask.shape[-1]
    words = num_words(n)
    padded = mask if words * BITS == n else torch.nn.functional.pad(mask, (0, words * BITS - n))  # [..., N, W*32]
    # Bit 31 has the int32 value -2**31, so a sum of distinct bits never overflows: sum == bitwise or.
    # The bit values are made on the device (no host->device copy), so a CUDA graph can capture the
    # packing: five kernels at most (pad, arange, shift, where, sum).
    bit = 1 << torch.arange(BITS, dtype=torch.int32, device=mask.device)  # [32]
    return torch.where(padded.view(*mask.shape[:-1], words, BITS), bit, 0).sum(-1, dtype=torch.int32)


def unpack_tree_mask(bits: Tensor, n: int) -> Tensor:
    """[..., N, W] int32 -> [..., N, n] bool (the inverse of pack_tree_mask)."""
    shifts = torch.arange(BITS, dtype=torch.int32, device=bits.device)
    unpacked = (bits[..., None] >> shifts) & 1  # [..., N, W, 32]
    return unpacked.flatten(-2)[..., :n].bool()


def ancestor_masks(parents: Tensor, depth: int) -> Tensor:
    """[..., N, N] bool of trees given by parents [..., N] (-1: no parent) of depth at most `depth`:
    mask[..., i, j] = j is i or an ancestor of i. Pointer doubling: after k steps every node has OR-ed
    in its 2^k nearest ancestors (the root and padding point at themselves). Tensor ops only."""
    n = parents.shape[-1]
    ids = torch.arange(n, device=parents.device)
    mask = torch.eye(n, dtype=torch.bool, device=parents.device).expand(*parents.shape, n)
    jump = torch.where(parents >= 0, parents, ids)
    steps = max(1, depth).bit_length()
    for step in range(steps):
        mask = mask | mask.gather(-2, jump[..., None].expand(*jump.shape, n))  # row i |= row jump[i]
        if step + 1 < steps:  # the last jump would go unused
            jump = jump.gather(-1, jump)
    return mask


def block_causal_mask(n: int, block: int, device: torch.device | str = "cpu") -> Tensor:
    """[n, n] bool: query i sees key j iff block(j) <= block(i) (bidirectional inside a block, causal
    across blocks; block = 1 gives the plain causal mask)."""
    blocks = torch.arange(n, device=device) // block
    return blocks[None, :] <= blocks[:, None]
