"""The norm/activation fused into the following matrix product (add+RMSNorm -> linear, SiLU*up -> linear, the
MLP block) against the reference compositions, and the per-shape choice between fused and unfused (CUDA, or
the interpreter: tiny shapes whose K and N are not multiples of the blocks; 1, 5, 17, 33 rows)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.kernels.norm_linear import (MAX_ROWS, add_rmsnorm_linear, add_rmsnorm_linear_fits,  # noqa: E402
                                           covering_row_tiles, add_rmsnorm_mlp, add_rmsnorm_mlp_then_linear,
                                           add_rmsnorm_then_linear, row_configs, silu_mul_linear)
from specbench.kernels.per_shape import FasterPerShape  # noqa: E402
from specbench.kernels.reference import (add_rmsnorm_linear_reference, add_rmsnorm_mlp_reference,  # noqa: E402
                                        silu_mul_linear_reference)

from kernel_cases import TOL, exact_casts, rel_err  # noqa: E402

K, N = 72, 40  # 2.25 x BLOCK_K, 2.5 x BLOCK_N under the interpreter


def _randn(g: torch.Generator, *shape: int, dtype: torch.dtype, device: str, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=g)).to(dtype).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 5, 17, 33])
@pytest.mark.parametrize("with_delta, with_bias", [(False, False), (True, False), (False, True), (True, True)])
def test_add_rmsnorm_linear_matches_reference(device, dtype, m, with_delta, with_bias) -> None:
    g = torch.Generator().manual_seed(m * 10 + 2 * with_delta + with_bias)
    x = _randn(g, 1, m, K, dtype=dtype, device=device)
    delta = _randn(g, 1, m, K, dtype=dtype, device=device) if with_delta else None
    nw = (1 + _randn(g, K, dtype=torch.float32, device=device, scale=0.1)).to(dtype)
    w = _randn(g, N, K, dtype=dtype, device=device, scale=K ** -0.5)
    bias = _randn(g, N, dtype=dtype, device=device) if with_bias else None
    y, resid = add_rmsnorm_linear(x, delta, nw, 1e-5, w, bias)
    y_ref, resid_ref = add_rmsnorm_linear_reference(x, delta, nw, 1e-5, w, bias)
    assert y.shape == (1, m, N) and y.dtype == dtype and resid.shape == x.shape
    assert rel_err(y, y_ref) <= TOL[dtype]
    if delta is None:
        assert resid is x
    else:
        assert torch.equal(resid, resid_ref) if exact_casts(device, dtype) else rel_err(resid, resid_ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 5, 17, 33])
def test_silu_mul_linear_matches_reference(device, dtype, m) -> None:
    g = torch.Generator().manual_seed(m)
    gate_up = _randn(g, m, 2 * K, dtype=dtype, device=device, scale=3.0)
    w = _randn(g, N, K, dtype=dtype, device=device, scale=K ** -0.5)
    y = silu_mul_linear(gate_up, w)
    assert y.shape == (m, N) and y.dtype == dtype
    assert rel_err(y, silu_mul_linear_reference(gate_up, w)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, norm_in_product", [(1, False), (5, False), (17, False), (33, False), (5, True), (33, True)])
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rmsnorm_mlp_matches_reference(device, dtype, m, norm_in_product, with_delta) -> None:
    """The MLP block: one row through the two matrix-vector kernels, more through the RMSNorm kernel, the gate/up
    product with its SiLU*up epilogue and cuBLAS (or the norm in the product's prologue: `norm_in_product`); I = 40
    is not a multiple of the interpreter's BLOCK_N, K = 72 not of its BLOCK_K."""
    g = torch.Generator().manual_seed(100 + m * 2 + with_delta)
    inter, out = N, 24
    x = _randn(g, 1, m, K, dtype=dtype, device=device, scale=4.0)  # a large stream: the row scale matters
    delta = _randn(g, 1, m, K, dtype=dtype, device=device) if with_delta else None
    nw = (1 + _randn(g, K, dtype=torch.float32, device=device, scale=0.1)).to(dtype)
    w_gu = _randn(g, 2 * inter, K, dtype=dtype, device=device, scale=2 * K ** -0.5)
    w_down = _randn(g, out, inter, dtype=dtype, device=device, scale=inter ** -0.5)
    y, resid = add_rmsnorm_mlp(x, delta, nw, 1e-5, w_gu, w_down, norm_in_product)
    y_ref, resid_ref = add_rmsnorm_mlp_reference(x, delta, nw, 1e-5, w_gu, w_down)
    assert y.shape == (1, m, out) and y.dtype == dtype
    assert rel_err(y, y_ref) <= TOL[dtype]
    if delta is None:
        assert resid is x
    else:
        assert torch.equal(resid, resid_ref) if exact_casts(device, dtype) else rel_err(resid, resid_ref) <= TOL[dtype]
    y_unfused, _ = add_rmsnorm_mlp_then_linear(x, delta, nw, 1e-5, w_gu, w_down) if device == "cuda" else (y_ref, None)
    assert rel_err(y_unfused, y_ref) <= TOL[dtype]


def test_mlp_shapes_that_do_not_fit_are_refused(device) -> None:
    x = torch.randn(1, 3, K).to(device)
    with pytest.raises(ValueError, match="do not make an MLP over rows of 72"):
        add_rmsnorm_mlp(x, None, torch.ones(K).to(device), 1e-5, torch.randn(2 * N, K).to(device),
                        torch.randn(8, N + 1).to(device))


def test_row_tiles_cover_the_rows_in_one_or_two_tiles() -> None:
    """The row kernels' pruner keeps the row tiles that cover M in one or two tiles (65 rows: 128 or 64; 5: 16),
    each with every (BLOCK_N, BLOCK_K) tile."""
    configs = row_configs()
    for m, bms in ((65, {64, 128}), (17, {16, 32}), (5, {16}), (128, {64, 128}), (33, {32, 64})):
        kept = covering_row_tiles(configs, max(16, 1 << (m - 1).bit_length()))
        assert {c.kwargs["BLOCK_M"] for c in kept} == bms
        assert len(kept) == len(bms) * len(configs) // 4


def test_mixed_dtypes_are_refused(device) -> None:
    x = torch.randn(2, K).to(device)
    with pytest.raises(ValueError, match="one dtype"):
        add_rmsnorm_linear(x, None, torch.ones(K).to(device), 1e-5, torch.randn(N, K).to(torch.bfloat16).to(device))


def test_per_shape_choice_falls_back_where_the_kernel_does_not_fit(device) -> None:
    """Rows beyond MAX_ROWS (prefill) take the unfused path, so do mixed dtypes; both give the reference."""
    calls: list[str] = []

    def fused(*args):
        calls.append("fused")
        return add_rmsnorm_linear(*args)

    def fallback(*args):
        calls.append("fallback")
        return add_rmsnorm_then_linear(*args)

    op = FasterPerShape(fused, fallback, add_rmsnorm_linear_fits, "add_rmsnorm_linear")
    g = torch.Generator().manual_seed(0)
    w, nw = _randn(g, N, K, dtype=torch.float32, device=device), torch.ones(K).to(device)
    for m in (3, MAX_ROWS + 1):
        x = _randn(g, m, K, dtype=torch.float32, device=device)
        y, _ = op(x, None, nw, 1e-5, w, None)
        assert rel_err(y, add_rmsnorm_linear_reference(x, None, nw, 1e-5, w)[0]) <= 1e-5
    assert calls[-1] == "fallback" and (device == "cuda" or calls[0] == "fused")
    assert not add_rmsnorm_linear_fits(x[:2], None, nw.double(), 1e-5, w, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_takes_the_matrix_vector_kernel_with_ragged_blocks(device, dtype) -> None:
    """M = 1 (a decode step) runs `_gemv_kernel`: N and K not multiples of its blocks, with bias and delta,
    and the SiLU*up prologue; both against the reference compositions."""
    g = torch.Generator().manual_seed(7)
    k, n = 100, 37
    x, delta = _randn(g, 1, 1, k, dtype=dtype, device=device), _randn(g, 1, 1, k, dtype=dtype, device=device)
    nw = (1 + _randn(g, k, dtype=torch.float32, device=device, scale=0.1)).to(dtype)
    w = _randn(g, n, k, dtype=dtype, device=device, scale=k ** -0.5)
    bias = _randn(g, n, dtype=dtype, device=device)
    y, resid = add_rmsnorm_linear(x, delta, nw, 1e-6, w, bias)
    y_ref, resid_ref = add_rmsnorm_linear_reference(x, delta, nw, 1e-6, w, bias)
    assert rel_err(y, y_ref) <= TOL[dtype]
    assert torch.equal(resid, resid_ref) if exact_casts(device, dtype) else rel_err(resid, resid_ref) <= TOL[dtype]
    gate_up = _randn(g, 1, 2 * k, dtype=dtype, device=device, scale=3.0)
    assert rel_err(silu_mul_linear(gate_up, w), silu_mul_linear_reference(gate_up, w)) <= TOL[dtype]


def test_bench_script_configs_compute_the_unfused_result(device) -> None:
    """scripts/bench_norm_linear.py launches the tile kernel at explicit configs, row tiles of 16 to 64
    included (what it times on the GPU): each agrees with the unfused pair, over several row tiles and a
    ragged last one."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_norm_linear.py"
    spec = importlib.util.spec_from_file_location("bench_norm_linear", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    cfgs = [(16, 16, 32, 4, 1), (32, 16, 32, 4, 1), (64, 32, 64, 4, 1)]
    errors = bench.check_configs(33, 64, 48, device, torch.float32, cfgs)
    assert set(errors) == set(cfgs) and max(errors.values()) < 1e-4, errors
    errors = bench.check_mlp_configs(33, 64, 40, device, torch.float32, cfgs)
    assert set(errors) == set(cfgs) and max(errors.values()) < 1e-4, errors
    x, _, nw, w = bench.inputs(33, 64, 48, device, torch.float32)
    for cfg in cfgs:  # the kernel without its norm: the plain product it is timed against cuBLAS as
        assert rel_err(bench.fused(x, None, nw, w, cfg), torch.nn.functional.linear(x, w)) < 1e-5
    assert {c[0] for c in bench.configs(65, 576, 960)} == {16, 32, 64, 128}
    assert {c[0] for c in bench.configs(17, 576, 960)} == {16, 32}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_linear_one_row_on_the_matrix_vector_kernel(device, dtype) -> None:
    """A decode step's wo (`LayerOps.output_linear`): one row through `_gemv_kernel` (MODE 2, ragged N and K),
    more rows through F.linear; the stream comes back untouched, the product against the reference."""
    from specbench.kernels.norm_linear import output_linear, output_linear_fits
    from specbench.kernels.reference import output_linear_reference

    g = torch.Generator().manual_seed(11)
    k, n = 100, 37
    w = _randn(g, n, k, dtype=dtype, device=device, scale=k ** -0.5)
    for rows in (1, 5):
        o = _randn(g, 1, rows, k, dtype=dtype, device=device)
        x = _randn(g, 1, rows, n, dtype=dtype, device=device)
        stream, y = output_linear(o, w, x)
        ref_stream, y_ref = output_linear_reference(o, w, x)
        assert stream is x and y.shape == y_ref.shape and rel_err(y, y_ref) <= TOL[dtype]
        assert output_linear_fits(o, w, x) == (rows == 1)
