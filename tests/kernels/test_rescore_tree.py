"""jetspec-tree's rescore in two launches (`kernels.rescore_tree`: the ranked top-k with the existing children
excluded, then one assembly program per candidate) returns what `rescore_tree_ops` returns: the same tokens,
parents, depths, float64 scores and grown ancestor mask, on trees whose nodes have several children, rows full of
ties and rows with fewer finite entries than `extend`."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.drafters.heads.jetspec_tree import rescore_tree_ops  # noqa: E402
from specbench.kernels.rescore_tree import rescore_tree  # noqa: E402
from specbench.trees.base import DraftTree  # noqa: E402


def _candidates(n: int, vocab: int, seed: int) -> tuple[torch.Tensor, ...]:
    """A random tree of n nodes (parents earlier, a few nodes with many children, tokens from a small set so
    siblings and cousins repeat) and its ancestor mask."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((n,), -1, dtype=torch.long)
    for i in range(1, n):
        parents[i] = int(torch.randint(0, min(i, 4) if i % 3 else i, (1,), generator=g))
    tokens = torch.randint(0, min(vocab, 40), (n,), generator=g)
    depth = torch.zeros(n, dtype=torch.long)
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    tree = DraftTree(tokens=tokens, parents=parents, depth=depth, scores=torch.zeros(n, dtype=torch.float64))
    return tokens, parents, depth, tree.ancestor_mask


def _logp(n: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    logits = (3 * torch.randn(n, vocab, generator=g)).bfloat16().float()  # bf16-rounded: ties in every row
    logits[1, 5:] = float("-inf")  # a row with five finite entries: -inf ties past them, children among them
    return torch.log_softmax(logits, -1)


@pytest.mark.parametrize("n, vocab, extend, max_depth", [
    (9, 300, 4, 3), (33, 700, 4, 16), (17, 500, 0, 16), (12, 64, 8, 2),
    pytest.param(65, 2500, 3, 5, marks=pytest.mark.slow),  # 46 s on CI's CPU (the interpreter): -m slow runs it
])
def test_the_kernel_path_returns_the_tensor_ops(device, n: int, vocab: int, extend: int, max_depth: int) -> None:
    tokens, parents, depth, mask = _candidates(n, vocab, seed=n + vocab)
    tokens[parents == 1] %= 5  # node 1's children among its row's finite entries (the path sums stay finite)
    node_logp = _logp(n, vocab, seed=n)
    want = rescore_tree_ops(tokens, parents, depth, mask, node_logp, extend, max_depth)
    got = rescore_tree(*(t.to(device) for t in (tokens, parents, depth, mask, node_logp)), extend, max_depth)
    for name, w, o in zip(("tokens", "parents", "depth", "scores", "mask"), want, got):
        assert w.dtype == o.dtype and torch.equal(w, o.cpu()), name
    m = n * (1 + extend)
    assert got[0].shape == (m,) and got[4].shape == (m, m)
    for i in range(n):  # a new leaf with a finite score never repeats one of its parent's children
        children = set(tokens[parents == i].tolist())
        leaves = slice(n + i * extend, n + (i + 1) * extend)
        assert not children & set(got[0].cpu()[leaves][got[3].cpu()[leaves].isfinite()].tolist())


def test_bad_shapes_are_refused(device) -> None:
    z = torch.zeros(4, dtype=torch.long, device=device)
    with pytest.raises(ValueError, match="rescore_tree: tokens"):
        rescore_tree(z, z, z, torch.zeros(3, 3, dtype=torch.bool, device=device), torch.zeros(4, 9, device=device), 2, 4)
    with pytest.raises(ValueError, match="extend must be in"):
        rescore_tree(z, z, z, torch.zeros(4, 4, dtype=torch.bool, device=device), torch.zeros(4, 9, device=device), 10, 4)
