"""kv_compact (in place, all layers in one launch) against index_select/index_copy."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not importable: the kernel tests need it (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.kernels.kv_compact import kv_compact  # noqa: E402
from specbench.kernels.reference import kv_compact_reference  # noqa: E402


def _random_path(n: int, length: int, g: torch.Generator, pad_to: int) -> torch.Tensor:
    """Root 0 then length - 1 increasing node ids in [1, n), padded with -1."""
    rest = torch.randperm(n - 1, generator=g)[: length - 1].sort().values + 1
    path = torch.cat([torch.zeros(1, dtype=torch.long), rest])
    return torch.cat([path, torch.full((pad_to - length,), -1, dtype=torch.long)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape, n, lengths", [
    ((3, 2, 2, 300, 64), 150, [1, 100]),  # path longer than one 64-row chunk: in-place order matters
    ((2, 1, 3, 40, 16), 9, [1]),
    ((1, 3, 1, 60, 128), 20, [12, 20, 1]),
])
def test_matches_reference(device, shape, n, lengths, dtype) -> None:
    g = torch.Generator().manual_seed(n)
    layers, b, hkv, slots, d = shape
    k = torch.randn(shape, generator=g).to(dtype).to(device)
    v = torch.randn(shape, generator=g).to(dtype).to(device)
    base = torch.randint(0, slots - n + 1, (b,), generator=g)
    path = torch.stack([_random_path(n, length, g, pad_to=n) for length in lengths])
    k_ref, v_ref = k.cpu().clone(), v.cpu().clone()
    kv_compact(k, v, path.to(device), base.to(device))
    kv_compact_reference(k_ref, v_ref, path, base)
    assert torch.equal(k.cpu(), k_ref) and torch.equal(v.cpu(), v_ref)


def test_path_already_in_place_moves_nothing(device) -> None:
    k = torch.randn(2, 1, 2, 30, 32).to(device)
    v = torch.randn(2, 1, 2, 30, 32).to(device)
    k0, v0 = k.clone(), v.clone()
    kv_compact(k, v, torch.tensor([[0, 1, 2, 3, -1]], device=device), torch.tensor([5], device=device))
    assert torch.equal(k, k0) and torch.equal(v, v0)


def test_bad_shapes_fail(device) -> None:
    k = torch.randn(2, 1, 2, 30, 32).to(device)
    with pytest.raises(ValueError, match="path must be"):
        kv_compact(k, k.clone(), torch.tensor([[0, 2], [0, 1]], device=device), torch.tensor([5], device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(30, 1, 3, 4352, 64), (36, 1, 8, 4352, 128)], ids=["smollm2", "qwen3-8b"])
def test_full_size_on_gpu(cuda, shape) -> None:
    g = torch.Generator().manual_seed(0)
    k = torch.randn(shape, dtype=torch.bfloat16, device=cuda)
    v = torch.randn(shape, dtype=torch.bfloat16, device=cuda)
    for length in (1, 8, 40, 256):
        path = _random_path(256, length, g, pad_to=256)[None]
        base = torch.tensor([4096])
        k_ref, v_ref = k.clone(), v.clone()
        kv_compact(k, v, path.to(cuda), base.to(cuda))
        kv_compact_reference(k_ref, v_ref, path.to(cuda), base.to(cuda))
        assert torch.equal(k, k_ref) and torch.equal(v, v_ref)
