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


def require_kernel_device(t: torch.Tensor) -> None:
    if t.device.type != "cuda" and not interpreting():
        raise RuntimeError(f"the Triton kernels need CUDA tensors (got {t.device}); set TRITON_INTERPRET=1 "
                           "to run them on the CPU")


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: any small number exercises the split path
