"""The device round's outcome rows (`DeviceForesight.decoder_law`: a top-k over the raw row's top-k and the
context's tokens, the boosts as a log-partition correction) = the dense rows the host round builds
(float64 z = beta l + boost over the vocabulary, log-softmax, top-k): the same k best log-probs, held by the
ids returned (distinct; equal to the dense top-k's wherever the order is strict), and each node's own
log-prob, to float64 rounding, with and without the n-gram expert, on fp32 rows and on bf16-rounded ones
(many equal values)."""

from __future__ import annotations

import types

import pytest
import torch

from specbench.drafters.jetspecpp.device_foresight import DeviceForesight
from specbench.drafters.jetspecpp.ngram import boost, tree_levels
from specbench.drafters.jetspecpp.selection import RowLaw
from specbench.trees.base import DraftTree


@pytest.mark.parametrize("seed", range(40))
def test_compact_rows_equal_the_dense_rows(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    v, n, s = int(torch.randint(20, 200, (1,), generator=g)), int(torch.randint(1, 10, (1,), generator=g)), 32
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    tree = DraftTree(tokens=torch.randint(0, v, (n,), generator=g), parents=torch.tensor(parents), depth=torch.tensor(depth))
    length = int(torch.randint(0, s - 2, (1,), generator=g))
    context = torch.full((s,), -1, dtype=torch.long)
    context[: length + 1] = torch.randint(0, min(v, 12), (length + 1,), generator=g)  # repeats: n-gram matches
    logits = torch.randn(n, v, generator=g) * 3
    if seed % 2:
        logits = logits.bfloat16().float()  # the GPU's rows: many equal values
    betas = torch.rand(4, generator=g, dtype=torch.float64) + 0.5
    etas = torch.rand(3, generator=g, dtype=torch.float64) * 3 if seed % 4 else None
    fs = types.SimpleNamespace(betas=betas, etas=etas, context=context, length=torch.tensor([length]))
    k = min(v, 4 + n)
    got = DeviceForesight.decoder_law(fs, logits, tree, k)  # type: ignore[arg-type]
    z = logits.double() * betas[tree.depth.clamp(max=3)][:, None]
    if etas is not None:
        z = z + boost(tree_levels(context, torch.tensor([length]), tree.tokens, tree.depth, tree.ancestor_mask, 2, v), etas)
    rows = z.log_softmax(-1)
    want = RowLaw.from_logp(rows, tree.tokens, tree.parents, k)
    torch.testing.assert_close(got.logp, want.logp, atol=1e-12, rtol=1e-12)  # the k best values, in order
    torch.testing.assert_close(rows.gather(1, got.ids), got.logp, atol=1e-12, rtol=1e-12)  # held by these ids
    assert all(len(set(r)) == k for r in got.ids.tolist()), "a token twice in a row's top-k"
    torch.testing.assert_close(got.child_logp, want.child_logp, atol=1e-12, rtol=1e-12)
    unique = (rows[:, None, :] == want.logp[:, :, None]).sum(-1) == 1  # [N, k]: a value no other token of the row has
    assert bool((got.ids == want.ids)[unique].all()), "the ids differ where the order is strict"
