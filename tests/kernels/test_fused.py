"""The fused layer kernels (RMSNorm with the residual add, q/k-norm + RoPE + K/V cache write, SiLU*up)
against their references, on fresh random inputs, in fp32 and bf16 (CUDA, or the interpreter)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.kernels.fused import qkv_rope, rmsnorm, silu_mul  # noqa: E402
from specbench.kernels.reference import qkv_rope_reference, rmsnorm_reference, silu_mul_reference  # noqa: E402

from kernel_cases import TOL, exact_casts, rel_err  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d, with_delta", [(64, False), (576, True), (96, True)])
def test_rmsnorm_matches_reference(device, dtype, d, with_delta) -> None:
    g = torch.Generator().manual_seed(d)
    x = torch.randn(2, 5, d, generator=g).to(dtype).to(device)
    delta = torch.randn(2, 5, d, generator=g).to(dtype).to(device) if with_delta else None
    w = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype).to(device)
    out, resid = rmsnorm(x, w, 1e-5, delta)
    ref_out, ref_resid = rmsnorm_reference(x, w, 1e-5, delta)
    assert out.dtype == ref_out.dtype and out.shape == ref_out.shape
    assert rel_err(out, ref_out) <= TOL[dtype]
    # the residual add rounds as `x + delta` does (the interpreter's bf16 casts truncate, CUDA's round)
    assert torch.equal(resid, ref_resid) if exact_casts(device, dtype) else rel_err(resid, ref_resid) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, kv, d, norm", [(4, 2, 16, False), (9, 3, 64, False), (4, 2, 32, True), (0, 2, 16, True)])
def test_qkv_rope_matches_reference(device, dtype, heads, kv, d, norm) -> None:
    g = torch.Generator().manual_seed(heads * 100 + d)
    b, n, slots_total = 2, 7, 40
    qkv = torch.randn(b, n, (heads + 2 * kv) * d, generator=g).to(dtype)
    pos = torch.randint(0, 500, (b, n), generator=g)
    freqs = pos[..., None].float() * (1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))
    emb = torch.cat([freqs, freqs], -1)[:, :, None, :]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    qn = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype) if norm else None
    kn = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype) if norm else None
    slots = torch.stack([torch.randperm(slots_total, generator=g)[:n] for _ in range(b)])
    caches = [torch.full((b, kv, slots_total, d), float("nan"), dtype=dtype) for _ in range(4)]
    dev = [t.to(device) if t is not None else None for t in (qkv, cos, sin, qn, kn, slots, caches[0], caches[1])]
    q = qkv_rope(dev[0], dev[1], dev[2], heads, kv, d, dev[6], dev[7], dev[5], dev[3], dev[4], eps=1e-6)
    q_ref = qkv_rope_reference(qkv, cos, sin, heads, kv, d, caches[2], caches[3], slots, qn, kn, eps=1e-6)
    if heads:
        assert q.shape == (b, heads, n, d) and q.stride(-1) == 1
        assert rel_err(q.cpu(), q_ref) <= TOL[dtype]
    else:
        assert q is None and q_ref is None
    written = torch.zeros(b, 1, slots_total, 1, dtype=torch.bool)
    written.scatter_(2, slots[:, None, :, None], True)
    k_got, v_got = dev[6].cpu(), dev[7].cpu()
    assert torch.isnan(k_got[~written.expand_as(k_got)]).all()  # nothing written outside the slots
    sel = written.expand_as(k_got)
    assert rel_err(k_got[sel], caches[2][sel]) <= TOL[dtype]
    assert torch.equal(v_got[sel], caches[3][sel])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_reference(device, dtype) -> None:
    g = torch.Generator().manual_seed(3)
    x = (3 * torch.randn(3, 2, 2 * 1536, generator=g)).to(dtype).to(device)
    got = silu_mul(x)
    ref = silu_mul_reference(x)
    assert got.shape == (3, 2, 1536)
    assert rel_err(got, ref) <= TOL[dtype]


def test_qkv_rope_rejects_a_bad_width(device) -> None:
    x = torch.randn(1, 2, 100).to(device)
    cache = torch.zeros(1, 2, 8, 16).to(device)
    with pytest.raises(ValueError, match="columns"):
        qkv_rope(x, x[..., :16], x[..., :16], 4, 2, 16, cache, cache, torch.zeros(1, 2, dtype=torch.long).to(device))
