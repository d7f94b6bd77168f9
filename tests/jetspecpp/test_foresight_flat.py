"""Foresight's flat row set (`foresight.flat_mask`): the mask of Q = B x b block rows over a cache's slots
is, row by row, each outcome's own keys: the committed slots, its node's ancestors among the tree's
slots, its own block's rows under the block pattern, and nothing past them (the free scratch)."""

from __future__ import annotations

import pytest
import torch

from specbench.drafters.heads.masks import block_pattern
from specbench.drafters.jetspecpp.foresight import flat_mask, flat_pattern


@pytest.mark.parametrize("pattern", ["block-causal", "bidirectional"])
def test_flat_mask_is_each_outcomes_keys(pattern: str) -> None:
    n, size, count, b = 5, 4, 3, 3  # committed, tree nodes, outcomes, block rows
    q, slots = count * b, 5 + 4 + 9 + 6  # six free slots past the flat rows
    ancestors = torch.rand(count, size, generator=torch.Generator().manual_seed(0)) < 0.5  # [B, N]
    got = flat_mask(torch.tensor([n]), torch.arange(1, slots + 1), ancestors.repeat_interleave(b, dim=0),
                    flat_pattern(count, b, pattern, "cpu"))
    assert got.shape == (1, 1, q, slots)
    want = torch.zeros(q, slots, dtype=torch.bool)
    within = block_pattern(b, pattern)
    for o in range(count):
        for i in range(b):
            r = o * b + i
            want[r, :n] = True
            want[r, n: n + size] = ancestors[o]
            want[r, n + size + o * b: n + size + (o + 1) * b] = within[i]
    assert torch.equal(got[0, 0], want)
    assert not got[0, 0, :, n + size + q:].any(), "a free slot past the flat rows was visible"
