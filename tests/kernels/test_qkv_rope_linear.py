"""The attention block's input projection with its head-wise epilogue (`add_rmsnorm_qkv_rope`) equals the plain
ops (`add_rmsnorm_qkv_rope_reference`: add+RMSNorm, the product, q/k norm, RoPE, K/V into the caches at their
slots) and the unfused Triton composition, with and without a residual delta, Qwen3's q/k norms and a qkv bias,
at one row (the matrix-vector path) and at several (the head kernel); slots off the cache's other entries stay."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.kernels.qkv_rope_linear import (add_rmsnorm_qkv_rope, add_rmsnorm_qkv_rope_fits,  # noqa: E402
                                               add_rmsnorm_qkv_rope_then_split)
from specbench.kernels.reference import add_rmsnorm_qkv_rope_reference  # noqa: E402

from kernel_cases import TOL, rel_err  # noqa: E402

K, H, HKV, D, S = 72, 3, 1, 32, 40  # K = 2.25 x the interpreter's BLOCK_K; D = 32: tl.dot's 16-wide halves


def _case(g: torch.Generator, b: int, n: int, dtype: torch.dtype, device: str, with_delta: bool, with_norm: bool,
          with_bias: bool) -> tuple:
    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=g)).to(dtype).to(device)

    x = randn(b, n, K, scale=3.0)
    delta = randn(b, n, K) if with_delta else None
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(dtype).to(device)
    w = randn((H + 2 * HKV) * D, K, scale=K ** -0.5)
    bias = randn((H + 2 * HKV) * D, scale=0.1) if with_bias else None
    pos = torch.randint(0, 500, (b, n, 1, 1), generator=g).float()
    freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    emb = torch.cat([pos * freq, pos * freq], dim=-1)  # [B, N, 1, D]
    cos, sin = emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)
    slots = torch.stack([torch.randperm(S, generator=g)[:n] for _ in range(b)]).to(device)  # [B, N] distinct
    norms = ((1 + 0.1 * torch.randn(D, generator=g)).to(dtype).to(device),
             (1 + 0.1 * torch.randn(D, generator=g)).to(dtype).to(device)) if with_norm else (None, None)
    return x, delta, nw, 1e-5, w, bias, cos, sin, H, HKV, D, slots, norms


def _run(fn, case, dtype: torch.dtype, device: str, g: torch.Generator):  # noqa: ANN001
    x, delta, nw, eps, w, bias, cos, sin, h, hkv, d, slots, (qn, kn) = case
    b = x.shape[0]
    k_cache = (torch.randn(b, hkv, S, d, generator=g)).to(dtype).to(device)
    v_cache = (torch.randn(b, hkv, S, d, generator=g)).to(dtype).to(device)
    q, resid = fn(x, delta, nw, eps, w, bias, cos, sin, h, hkv, d, k_cache, v_cache, slots, qn, kn, 1e-6)
    return q, resid, k_cache, v_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, n", [(1, 1), (1, 5), (2, 9), (1, 33)])
@pytest.mark.parametrize("with_delta, with_norm, with_bias", [(False, False, False), (True, False, False),
                                                              (True, True, False), (False, True, True)])
def test_equals_reference(device, dtype, b, n, with_delta, with_norm, with_bias) -> None:
    g = torch.Generator().manual_seed(b * 100 + n * 8 + 4 * with_delta + 2 * with_norm + with_bias)
    case = _case(g, b, n, dtype, device, with_delta, with_norm, with_bias)
    seed = int(torch.randint(0, 1 << 30, (1,), generator=g))
    got = _run(add_rmsnorm_qkv_rope, case, dtype, device, torch.Generator().manual_seed(seed))
    want = _run(add_rmsnorm_qkv_rope_reference, case, dtype, device, torch.Generator().manual_seed(seed))
    assert got[0].shape == (b, H, n, D) and got[0].dtype == dtype
    for a, r in zip(got, want):  # q, the stream, the K and V caches (untouched slots included)
        assert rel_err(a, r) <= TOL[dtype], (rel_err(a, r), a.shape)
    if device == "cuda":  # the unfused Triton composition (FasterPerShape's fallback) agrees too
        alt = _run(add_rmsnorm_qkv_rope_then_split, case, dtype, device, torch.Generator().manual_seed(seed))
        for a, r in zip(alt, want):
            assert rel_err(a, r) <= TOL[dtype]


def test_untouched_slots_stay_and_fits_refuses_small_heads(device) -> None:
    g = torch.Generator().manual_seed(7)
    case = _case(g, 1, 5, torch.float32, device, True, False, False)
    k_before = torch.randn(1, HKV, S, D, generator=torch.Generator().manual_seed(3)).to(device)
    q, _, k_cache, _ = _run(add_rmsnorm_qkv_rope, case, torch.float32, device, torch.Generator().manual_seed(3))
    written = set(case[11][0].tolist())
    for s in range(S):
        if s not in written:
            assert torch.equal(k_cache[0, :, s], k_before[0, :, s])
    x, delta, nw, eps, w, bias, cos, sin = case[:8]
    assert add_rmsnorm_qkv_rope_fits(x, delta, nw, eps, w, bias, cos, sin, H, HKV, D, k_cache, k_cache, case[11])
    assert not add_rmsnorm_qkv_rope_fits(x, delta, nw, eps, w, bias, cos, sin, H, HKV, 16, k_cache, k_cache,
                                         case[11])  # 8-wide halves
    assert not add_rmsnorm_qkv_rope_fits(x, delta, nw, eps, w, bias, cos, sin, H, HKV, D, k_cache.double(), k_cache,
                                         case[11])  # a cache of another dtype
    with pytest.raises(ValueError, match="is not"):
        add_rmsnorm_qkv_rope(x, delta, nw, eps, w, bias, cos, sin, H + 1, HKV, D, k_cache, k_cache, case[11])
