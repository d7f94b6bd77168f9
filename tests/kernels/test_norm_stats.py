"""RMSNorm's statistics from the product that writes the stream (`specbench.kernels.norm_stats`): the product with
its residual epilogue and row sums of squares equals its reference, and the consumers that take those sums with the
norm weight folded into their weights (the MLP's gate/up kernel; wqkv by cuBLAS then `qkv_rope(row_sumsq=)`) equal
the unfused add+RMSNorm -> product -> epilogue ops, so one layer's chain can run without the two RMSNorm kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.kernels.fused import qkv_rope  # noqa: E402
from specbench.kernels.norm_stats import SUMSQ_TILE, fold_norm, gate_up_silu_scaled, linear_residual  # noqa: E402
from specbench.kernels.reference import (gate_up_silu_scaled_reference, linear_residual_reference,  # noqa: E402
                                         qkv_rope_reference, rmsnorm_reference, silu_mul_reference)

from kernel_cases import rel_err  # noqa: E402

K, N, INTER, H, HKV, D, S = 72, 80, 48, 3, 1, 32, 40  # N = 2.5 column tiles; D = 32: the kernels' small heads
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # bf16: a few roundings of operands ordered differently


def _randn(g: torch.Generator, *shape: int, dtype: torch.dtype, device: str, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=g)).to(dtype).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 5, 33, 65])
def test_linear_residual_equals_reference(device, dtype, m) -> None:
    g = torch.Generator().manual_seed(m)
    a, x = _randn(g, m, K, dtype=dtype, device=device), _randn(g, m, N, dtype=dtype, device=device, scale=3.0)
    w = _randn(g, N, K, dtype=dtype, device=device, scale=K ** -0.5)
    out, ss = linear_residual(a, w, x)
    want, want_ss = linear_residual_reference(a, w, x)
    assert ss.shape == (m, -(-N // SUMSQ_TILE)) and ss.dtype == torch.float32
    assert rel_err(out, want) <= TOL[dtype]
    assert rel_err(ss.sum(1), want_ss) <= TOL[dtype]
    if dtype == torch.float32:  # the sums are of the stream as written
        assert rel_err(ss.sum(1), out.float().pow(2).sum(-1)) <= 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [5, 65])
def test_gate_up_from_the_producers_sums_equals_the_unfused_mlp_input(device, dtype, m) -> None:
    g = torch.Generator().manual_seed(100 + m)
    a, x = _randn(g, m, K, dtype=dtype, device=device), _randn(g, m, N, dtype=dtype, device=device, scale=3.0)
    w = _randn(g, N, K, dtype=dtype, device=device, scale=K ** -0.5)
    norm_w = (1 + 0.1 * torch.randn(N, generator=g)).to(dtype).to(device)
    w_gu = _randn(g, 2 * INTER, N, dtype=dtype, device=device, scale=N ** -0.5)
    stream, ss = linear_residual(a, w, x)
    got = gate_up_silu_scaled(stream, ss, 1e-5, fold_norm(norm_w, w_gu))
    h, resid = rmsnorm_reference(x, norm_w, 1e-5, F.linear(a, w))  # the unfused: add+RMSNorm, product, SiLU*up
    assert rel_err(stream, resid) <= TOL[dtype]
    assert rel_err(got, silu_mul_reference(F.linear(h, w_gu))) <= TOL[dtype]
    ref = gate_up_silu_scaled_reference(stream, ss.sum(1), 1e-5, fold_norm(norm_w, w_gu))
    assert rel_err(got, ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_qk_norm", [False, True])
def test_qkv_rope_scaled_by_the_producers_sums_equals_the_unfused_attention_input(device, dtype, with_qk_norm) -> None:
    b, n = 1, 9
    g = torch.Generator().manual_seed(7 + with_qk_norm)
    a, x = _randn(g, b, n, K, dtype=dtype, device=device), _randn(g, b, n, N, dtype=dtype, device=device, scale=3.0)
    w = _randn(g, N, K, dtype=dtype, device=device, scale=K ** -0.5)
    norm_w = (1 + 0.1 * torch.randn(N, generator=g)).to(dtype).to(device)
    wqkv = _randn(g, (H + 2 * HKV) * D, N, dtype=dtype, device=device, scale=N ** -0.5)
    pos = torch.arange(n).float().reshape(1, n, 1, 1) + 17
    freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    emb = torch.cat([pos * freq, pos * freq], dim=-1)
    cos, sin = emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)
    slots = (torch.arange(n) + 3).reshape(b, n).to(device)
    qk = ((1 + 0.1 * torch.randn(D, generator=g)).to(dtype).to(device),
          (1 + 0.1 * torch.randn(D, generator=g)).to(dtype).to(device)) if with_qk_norm else (None, None)

    def caches() -> tuple[torch.Tensor, torch.Tensor]:
        c = torch.Generator().manual_seed(3)
        return (_randn(c, b, HKV, S, D, dtype=dtype, device=device), _randn(c, b, HKV, S, D, dtype=dtype, device=device))

    stream, ss = linear_residual(a, w, x)
    kc, vc = caches()
    q = qkv_rope(F.linear(stream, fold_norm(norm_w, wqkv)), cos, sin, H, HKV, D, kc, vc, slots, *qk, 1e-6,
                 row_sumsq=ss, stream_dim=N, stream_eps=1e-5)
    h, _ = rmsnorm_reference(x, norm_w, 1e-5, F.linear(a, w))
    kr, vr = caches()
    want = qkv_rope_reference(F.linear(h, wqkv), cos, sin, H, HKV, D, kr, vr, slots, *qk, 1e-6)
    assert rel_err(q, want) <= TOL[dtype]
    assert rel_err(kc, kr) <= TOL[dtype] and rel_err(vc, vr) <= TOL[dtype]


def test_bad_inputs_name_what_to_change(device) -> None:
    a = torch.zeros(4, K, device=device)
    with pytest.raises(ValueError, match="weight must be"):
        linear_residual(a, torch.zeros(N, K + 1, device=device), torch.zeros(4, N, device=device))
    with pytest.raises(ValueError, match="row_sumsq"):
        gate_up_silu_scaled(torch.zeros(4, N, device=device), torch.zeros(3, 3, device=device), 1e-5,
                            torch.zeros(2 * INTER, N, device=device))


def test_folded_weights_follow_in_place_updates(device) -> None:
    from specbench.kernels.norm_stats import NormStatsOps

    ops = NormStatsOps(None, None, None, None)  # type: ignore[arg-type]
    w = torch.randn(8, 4, device=device)
    g = torch.rand(4, device=device) + 0.5
    first = ops.folded(g, w)
    assert ops.folded(g, w) is first and torch.equal(first, fold_norm(g, w))
    with torch.no_grad():
        w.mul_(2)  # a training step, in place
    again = ops.folded(g, w)
    assert again is not first and torch.equal(again, fold_norm(g, w))
    with torch.no_grad():
        g.add_(1)
    assert torch.equal(ops.folded(g, w), fold_norm(g, w))
    assert len(ops._folded) == 1
    del w, first, again
    import gc

    gc.collect()
    assert len(ops._folded) == 0, "an entry outlived its weight"
