"""ancestor_mask (one program per tree) against the pointer-doubling reference the CPU runs, and both
against the loop over nodes in kernel_cases."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not importable: the kernel tests need it (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from kernel_cases import ancestor_mask as loop_mask, random_parents  # noqa: E402

from specbench.kernels.ancestor_mask import MAX_NODES, ancestor_mask  # noqa: E402
from specbench.kernels.masks import ancestor_masks  # noqa: E402


def _depth(parents: torch.Tensor) -> int:
    depth = [0] * parents.numel()
    for i, p in enumerate(parents.tolist()):
        depth[i] = depth[p] + 1 if p >= 0 else 0
    return max(depth)


@pytest.mark.parametrize("n", [1, 2, 17, 33, 65, 130, 257])
def test_matches_the_reference_on_random_trees(device, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    for max_back in (None, 1, 3):  # bushy, a chain, deep and branching
        parents = random_parents(n, g, max_back=max_back)
        got = ancestor_mask(parents.to(device)).cpu()
        assert torch.equal(got, ancestor_masks(parents, max(1, _depth(parents))))
        assert torch.equal(got, loop_mask(parents))


def test_batched_with_padding_and_strided_parents(device) -> None:
    """[B, N] trees, one a forest of padding (parent -1 beyond the root: each sees only itself); parents given
    as a non-contiguous view, as a static buffer's slice may be."""
    g = torch.Generator().manual_seed(0)
    trees = torch.stack([random_parents(40, g, max_back=4), torch.full((40,), -1), random_parents(40, g)])
    trees[0, 30:] = -1  # a padded tail
    wide = torch.full((3, 80), 7)
    wide[:, ::2] = trees
    view = wide[:, ::2]
    got = ancestor_mask(view.to(device)).cpu()
    assert got.shape == (3, 40, 40)
    assert torch.equal(got, ancestor_masks(trees, 39))
    assert torch.equal(got[1], torch.eye(40, dtype=torch.bool))


def test_a_malformed_parent_array_ends(device) -> None:
    """A cycle (no valid tree has one) ends after N steps rather than looping on the device."""
    got = ancestor_mask(torch.tensor([-1, 2, 1], device=device)).cpu()
    assert got[0].tolist() == [True, False, False] and got[1, 1] and got[1, 2] and got[2, 1]


def test_rejects_sizes_out_of_range(device) -> None:
    with pytest.raises(ValueError, match="nodes"):
        ancestor_mask(torch.full((MAX_NODES + 1,), -1, device=device))


def test_the_tree_path_takes_the_tensor_ops_past_the_kernels_limit(monkeypatch) -> None:
    """`DraftTree.ancestor_mask` on CUDA: the kernel up to MAX_NODES nodes, the tensor ops beyond (a budget-1024
    tree has 1,025 nodes). The CUDA test runs it on the device; on the CPU `is_cuda` is faked on a stand-in."""
    from specbench.trees import base

    calls: list[str] = []

    class Parents(torch.Tensor):  # a CPU tensor that says it is on CUDA
        @property
        def is_cuda(self) -> bool:  # type: ignore[override]
            return True

    monkeypatch.setattr("specbench.kernels.ancestor_mask.ancestor_mask", lambda p: calls.append("kernel") or p)
    monkeypatch.setattr(base, "ancestor_masks", lambda p, d: calls.append("ops") or p)
    base.device_ancestor_masks(torch.full((MAX_NODES,), -1).as_subclass(Parents), 1)
    base.device_ancestor_masks(torch.full((MAX_NODES + 1,), -1).as_subclass(Parents), 1)
    assert calls == ["kernel", "ops"]
