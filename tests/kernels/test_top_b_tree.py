"""The one-program top-B tree kernel returns exactly `build_top_b`'s tree (tokens, parents, depths,
scores, node order), ties included, on fresh random tables."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.kernels.top_b_tree import TopBTree, tree_size  # noqa: E402
from specbench.trees.base import DepthScores  # noqa: E402
from specbench.trees.ddtree_vec import build_top_b  # noqa: E402


def _case(depth: int, vocab: int, budget: int, seed: int, ties: bool, device: str):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 3, (depth, vocab), generator=g).float() if ties else 3 * torch.randn(depth, vocab, generator=g)
    tok, lp = DepthScores(5, torch.log_softmax(raw, -1)).topk(min(budget, vocab))
    ref = build_top_b(5, tok, lp, budget)
    got = TopBTree(budget, min(budget, vocab), torch.device(device))(torch.tensor([5], device=device), tok.to(device),
                                                                      lp.to(device))
    return got, ref


@pytest.mark.parametrize("depth, vocab, budget, ties", [(3, 5, 4, False), (6, 50, 12, False), (4, 3, 10, True),
                                                        (2, 9, 7, False), (5, 20, 9, True)])
def test_kernel_equals_build_top_b(device, depth, vocab, budget, ties) -> None:
    for seed in range(2):
        got, ref = _case(depth, vocab, budget, seed, ties, device)
        assert got[0].numel() == ref.num_nodes == 1 + tree_size(depth, min(budget, vocab), budget)
        for a, b in zip(got[:3], (ref.tokens, ref.parents, ref.depth)):
            assert torch.equal(a.cpu(), b)
        assert torch.equal(got[3].cpu(), ref.scores.float())


@pytest.mark.gpu
@pytest.mark.parametrize("depth, vocab, budget", [(15, 49152, 64), (15, 49152, 256), (15, 151936, 16)])
def test_kernel_equals_build_top_b_full_size(cuda, depth, vocab, budget) -> None:
    got, ref = _case(depth, vocab, budget, 0, False, cuda)
    for a, b in zip(got[:3], (ref.tokens, ref.parents, ref.depth)):
        assert torch.equal(a.cpu(), b.cpu())
