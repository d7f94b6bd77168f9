"""pack_tree_mask_kernel (one launch) against masks.pack_tree_mask (the tensor ops the CPU runs), and both against
unpacking: every bit of every word, bit 31 (the sign) included, for the masks a forward packs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not importable: the kernel tests need it (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from kernel_cases import random_parents  # noqa: E402

from specbench.kernels.masks import ancestor_masks, pack_tree_mask, unpack_tree_mask  # noqa: E402
from specbench.kernels.pack_bits import pack_bits, pack_tree_mask_kernel  # noqa: E402


@pytest.mark.parametrize("n,m", [(1, 1), (3, 31), (5, 32), (7, 33), (65, 65), (17, 96), (130, 130), (2, 1100)])
def test_random_masks_equal_the_reference(device, n: int, m: int) -> None:
    g = torch.Generator().manual_seed(n * 1000 + m)
    mask = torch.rand(3, n, m, generator=g) < 0.5
    mask[0, :, -1] = True  # the last key of a word set: bit 31 where m % 32 == 0
    got = pack_tree_mask_kernel(mask.to(device)).cpu()
    want = pack_tree_mask(mask)
    assert got.dtype == torch.int32 and got.shape == want.shape
    assert torch.equal(got, want)
    assert torch.equal(unpack_tree_mask(got, m), mask)
    assert torch.equal(pack_bits(mask.to(device)).cpu(), want)  # what the callers use: the kernel on CUDA


def test_tree_masks_and_the_causal_default(device) -> None:
    """What the target's forward packs: a tree's ancestor mask, and the causal default (an expanded view: stride 0
    over the batch), and a one-node AR step's mask."""
    g = torch.Generator().manual_seed(0)
    parents = torch.stack([random_parents(65, g), random_parents(65, g, max_back=1)])
    trees = ancestor_masks(parents, 65)  # [2, 65, 65]
    assert torch.equal(pack_tree_mask_kernel(trees.to(device)).cpu(), pack_tree_mask(trees))
    causal = torch.ones(40, 40, dtype=torch.bool).tril_()[None].expand(3, 40, 40)
    got = pack_tree_mask_kernel(causal.to(device))
    assert torch.equal(got.cpu(), pack_tree_mask(causal))
    one = torch.ones(1, 1, 1, dtype=torch.bool)
    assert pack_tree_mask_kernel(one.to(device)).cpu().tolist() == [[[1]]]


def test_strided_and_batched_shapes(device) -> None:
    g = torch.Generator().manual_seed(1)
    wide = torch.rand(2, 4, 9, 80, generator=g) < 0.3
    view = wide[..., 5:70]  # [2, 4, 9, 65], rows not contiguous
    assert torch.equal(pack_tree_mask_kernel(view.to(device)).cpu(), pack_tree_mask(view))
    transposed = (torch.rand(50, 33, generator=g) < 0.5).t()  # [33, 50]: column-major
    assert torch.equal(pack_tree_mask_kernel(transposed.to(device)).cpu(), pack_tree_mask(transposed))


def test_bad_input_is_refused(device) -> None:
    with pytest.raises(ValueError, match="bool tensor"):
        pack_tree_mask_kernel(torch.ones(4, 4, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="bool tensor"):
        pack_tree_mask_kernel(torch.ones(4, dtype=torch.bool, device=device))
