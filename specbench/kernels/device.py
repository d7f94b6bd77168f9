"""Where the Triton kernels may run: a CUDA device, or the CPU under TRITON_INTERPRET=1 (tests)."""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def autotune_first_only() -> bool:
    """SPECBENCH_AUTOTUNE=first: autotuned kernels compile and run only their first eligible config. For
    correctness runs (the CUDA tests), where compiling every config of every shape is most of the time;
    never for timings."""
    return os.environ.get("SPECBENCH_AUTOTUNE", "") == "first"


def tile_footprint(config) -> int:  # type: ignore[no-untyped-def]
    """A row kernel config's pipelined operand elements (num_stages x (BLOCK_M + BLOCK_N) x BLOCK_K): what its
    shared memory grows with."""
    kw = config.kwargs
    return config.num_stages * (kw.get("BLOCK_M", 1) + kw.get("BLOCK_N", 1)) * kw.get("BLOCK_K", 1)


def autotune_kept(kept: list) -> list:  # type: ignore[type-arg]
    """What an autotuner's pruner returns: every config it kept, or under SPECBENCH_AUTOTUNE=first the one of the
    smallest `tile_footprint`. Autotuning skips a config that asks more shared memory than the device has;
    a single config cannot be skipped, so it must be one that fits (the first of the list did not: fp32 row
    tiles of 64-128 rows asked 280 KB of an H200's 227, 2026-12-03)."""
    if not autotune_first_only() or len(kept) <= 1:
        return kept
    return [min(kept, key=tile_footprint)]


def require_kernel_device(t: torch.Tensor) -> None:
    if t.device.type != "cuda" and not interpreting():
        raise RuntimeError(f"the Triton kernels need CUDA tensors (got {t.device}); set TRITON_INTERPRET=1 "
                           "to run them on the CPU")


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: any small number exercises the split path
