"""The one-program top-B tree kernel returns exactly `build_top_b`'s tree (tokens, parents, depths,
scores, node order), ties included, on fresh random tables."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

import triton.language as tl  # noqa: E402

from specbench.kernels.top_b_tree import TopBTree, tree_size  # noqa: E402
from specbench.trees.base import DepthScores  # noqa: E402
from specbench.trees.ddtree_vec import build_top_b  # noqa: E402


def _raw(depth: int, vocab: int, seed: int, ties: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 3, (depth, vocab), generator=g).float() if ties else 3 * torch.randn(depth, vocab, generator=g)


def _reference(depth: int, vocab: int, budget: int, seed: int, ties: bool):
    """(top-k tokens, their log-probs, `build_top_b`'s tree) of one random table, on the CPU."""
    tok, lp = DepthScores(5, torch.log_softmax(_raw(depth, vocab, seed, ties), -1)).topk(min(budget, vocab))
    return tok, lp, build_top_b(5, tok, lp, budget)


def _case(depth: int, vocab: int, budget: int, seed: int, ties: bool, device: str, use_topk: bool | None = None):
    tok, lp, ref = _reference(depth, vocab, budget, seed, ties)
    got = TopBTree(budget, min(budget, vocab), torch.device(device), use_topk=use_topk)(
        torch.tensor([5], device=device), tok.to(device), lp.to(device))
    return got, ref


@pytest.mark.parametrize("use_topk", [True, False] if hasattr(tl, "topk") else [False], ids=lambda t: "topk" if t else "sort")
@pytest.mark.parametrize("depth, vocab, budget, ties", [(3, 5, 4, False), (6, 50, 12, False), (4, 3, 10, True),
                                                        (2, 9, 7, False), (5, 20, 9, True), (4, 40, 33, True)])
def test_kernel_equals_build_top_b(device, use_topk, depth, vocab, budget, ties) -> None:
    """Every beam keeps its best by `tl.topk` (a partial network) or by a full `tl.sort`: the same tree."""
    for seed in range(2):
        got, ref = _case(depth, vocab, budget, seed, ties, device, use_topk)
        assert got[0].numel() == ref.num_nodes == 1 + tree_size(depth, min(budget, vocab), budget)
        for a, b in zip(got[:3], (ref.tokens, ref.parents, ref.depth)):
            assert torch.equal(a.cpu(), b)
        assert torch.equal(got[3].cpu(), ref.scores.float())


def test_entries_above_zero_are_clamped_as_the_reference_clamps(device) -> None:
    """Log-probs a hair above 0 (rounding) count as 0 in both builders: the kernel clamps as it loads, from a
    float32 table with a row stride of its own (a slice) and from a float64 one (converted first)."""
    tok, lp, _ = _reference(5, 30, 16, 3, False)
    lp = lp.clone()
    lp[0, 0], lp[2, 0], lp[3, :2] = 1e-6, 0.5, 2.0  # above 0: ranked first, as a top-k of unclamped values is
    ref = build_top_b(5, tok, lp, 16)
    wide = torch.full((5, 40), -7.0)
    wide[:, :lp.shape[1]] = lp
    for table in (wide[:, :lp.shape[1]], lp.double()):
        got = TopBTree(16, lp.shape[1], torch.device(device))(torch.tensor([5], device=device), tok.to(device),
                                                            table.to(device))
        for a, b in zip(got[:3], (ref.tokens, ref.parents, ref.depth)):
            assert torch.equal(a.cpu(), b)
        assert torch.equal(got[3].cpu(), ref.scores.float())


@pytest.mark.gpu
@pytest.mark.parametrize("warps", [1, 2, 8, 16])
def test_kernel_at_other_warp_counts_equals_build_top_b(cuda, warps) -> None:
    """The launch's warp count (what scripts/bench_top_b_tree.py sweeps) changes no tree."""
    tok, lp, ref = _reference(15, 49152, 64, 0, False)
    got = TopBTree(64, 64, torch.device(cuda), num_warps=warps)(torch.tensor([5], device=cuda), tok.to(cuda), lp.to(cuda))
    for a, b in zip(got[:3], (ref.tokens, ref.parents, ref.depth)):
        assert torch.equal(a.cpu(), b.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("depth, vocab, budget", [(15, 49152, 64), (15, 49152, 256), (15, 151936, 16)])
def test_kernel_equals_build_top_b_full_size(cuda, depth, vocab, budget) -> None:
    got, ref = _case(depth, vocab, budget, 0, False, cuda)
    for a, b in zip(got[:3], (ref.tokens, ref.parents, ref.depth)):
        assert torch.equal(a.cpu(), b.cpu())


@pytest.mark.parametrize("depth, vocab, budget, ties", [(3, 5, 4, False), (6, 50, 12, False), (4, 3, 10, True),
                                                        (5, 20, 9, True)])
def test_batched_launch_equals_one_build_per_tree(device, depth, vocab, budget, ties) -> None:
    """`TopBTree.batch` (one program per tree) returns each tree as `build_top_b` does."""
    tables = [_reference(depth, vocab, budget, seed, ties) for seed in range(4)]  # the reference on the CPU, any device
    cases = [ref for _, _, ref in tables]
    anchors = torch.tensor([5, 7, 9, 11])
    got = TopBTree(budget, min(budget, vocab), torch.device(device)).batch(
        anchors.to(device), torch.stack([t for t, _, _ in tables]).to(device), torch.stack([v for _, v, _ in tables]).to(device))
    for i, ref in enumerate(cases):
        assert int(got[0][i, 0]) == int(anchors[i])
        assert torch.equal(got[0][i, 1:].cpu(), ref.tokens[1:])
        for a, b in zip(got[1:3], (ref.parents, ref.depth)):
            assert torch.equal(a[i].cpu(), b)
        assert torch.equal(got[3][i].cpu(), ref.scores.float())


@pytest.mark.gpu
def test_ddtree_vec_build_batch_on_cuda_equals_one_build_per_tree(cuda) -> None:
    """The policy's batched build on CUDA (one ranked top-k, one launch) = its per-tree builds (a launch each)."""
    from specbench.trees.ddtree_vec import DDTreeVecPolicy

    policy = DDTreeVecPolicy()
    logp = torch.log_softmax(3 * torch.randn(16, 15, 49152, generator=torch.Generator().manual_seed(1)), -1).to(cuda)
    anchors = torch.arange(16, device=cuda)
    batch = policy.build_batch(anchors, logp, 64)
    for i in range(16):
        tree = policy.build(DepthScores(anchors[i: i + 1], logp[i]), 64)
        for name in ("tokens", "parents", "depth", "scores"):
            assert torch.equal(getattr(batch, name)[i], getattr(tree, name)), name
