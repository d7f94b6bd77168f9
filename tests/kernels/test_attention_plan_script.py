"""scripts/bench_attention_plan.py: every config of its grid computes the tree attention of the reference (tiny
shapes under the interpreter, or CUDA), split counts that leave some splits without keys included."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from kernel_cases import load_script  # noqa: E402


def _script():
    return load_script("bench_attention_plan")


def test_grid_configs_agree_with_the_reference(device) -> None:
    bench = _script()
    from specbench.kernels.tree_attention import AttentionConfig

    cfgs = [AttentionConfig(16, 32, 4, 1, s, fused) for s in (1, 3, 8) for fused in (False, True)] \
        + [AttentionConfig(32, 16, 4, 1, 2)]
    errors = bench.check_configs(4, 2, 16, 5, 40, 64, device, torch.float32, cfgs)
    assert set(errors) == set(cfgs) and max(errors.values()) < 1e-5, errors
    assert {c.block_m for c in bench.grid(3)} == {16}  # an AR step's 3 rows: the smallest row tile only
    assert {c.block_m for c in bench.grid(195)} == {16, 32, 64, 128}


def test_decode_configs_agree_with_the_reference(device) -> None:
    """`--decode`'s grid runs the decode kernel through the same check (one node; splits past the key tiles)."""
    bench = _script()
    from specbench.kernels.decode_attention import DecodeConfig

    cfgs = [DecodeConfig(bs, 4, 1, s) for bs in (16, 32) for s in (1, 3, 8)]
    errors = bench.check_configs(4, 2, 16, 1, 40, 64, device, torch.float32, cfgs)
    assert set(errors) == set(cfgs) and max(errors.values()) < 1e-5, errors
    assert all(bs in {32, 64, 128} for bs, _, _ in bench.DECODE_TILES)
