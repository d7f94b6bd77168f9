"""Under SPECBENCH_AUTOTUNE=first (the CUDA correctness runs) an autotuned kernel has one config, which must fit in
shared memory: the H200 raised OutOfResources for the first fp32 row config of 64-128 rows (2026-12-03)."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from specbench.kernels.device import autotune_kept, tile_footprint  # noqa: E402
from specbench.kernels.norm_linear import _ROW_CONFIGS, covering_row_tiles  # noqa: E402

H200_SHARED_BYTES = 232_448


def test_every_config_kept_when_autotuning(monkeypatch) -> None:
    monkeypatch.delenv("SPECBENCH_AUTOTUNE", raising=False)
    assert autotune_kept(list(_ROW_CONFIGS)) == list(_ROW_CONFIGS)


@pytest.mark.parametrize("m_bucket", [16, 32, 64, 128])
def test_first_only_takes_the_smallest_tile(monkeypatch, m_bucket) -> None:
    monkeypatch.setenv("SPECBENCH_AUTOTUNE", "first")
    kept = covering_row_tiles(_ROW_CONFIGS, m_bucket)
    (one,) = autotune_kept(kept)
    assert tile_footprint(one) == min(map(tile_footprint, kept))
    # fp32 operands of the gate/up kernel: the A tile and two weight tiles per stage
    stage_bytes = (one.kwargs["BLOCK_M"] + 2 * one.kwargs["BLOCK_N"]) * one.kwargs["BLOCK_K"] * 4
    assert one.num_stages * stage_bytes < H200_SHARED_BYTES


def test_footprint_counts_stages_and_tiles() -> None:
    small = triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64}, num_stages=2)
    big = triton.Config({"BLOCK_M": 128, "BLOCK_N": 16, "BLOCK_K": 128}, num_stages=4)
    assert tile_footprint(small) == 2 * 32 * 64 and tile_footprint(big) == 4 * 144 * 128
