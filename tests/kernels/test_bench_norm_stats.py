"""scripts/bench_norm_stats.py: the chain with the norms' statistics from the products computes today's chain (tiny
shapes under the interpreter, or CUDA), Qwen3's q/k norms included."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from kernel_cases import load_script  # noqa: E402


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_the_two_chains_agree(device, qk_norm, dtype, tol) -> None:
    bench = load_script("bench_norm_stats")
    shape = (64, 48, 2, 1, 32, qk_norm, 2)  # hidden, intermediate, heads, KV heads, head dim, q/k norm, layers
    errors = bench.chains_agree(shape, 9, device, dtype, slots=24)
    assert max(errors.values()) <= tol, errors
