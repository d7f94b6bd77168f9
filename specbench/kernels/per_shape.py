"""The faster of two implementations of one op, chosen per input shape by timing both once on the device.

A fused kernel is not faster everywhere (a wide product may suit cuBLAS better than a small-M Triton
tile), so the choice is measured, not assumed: the first call with a new shape (and dtype, device,
optional arguments present) times both under CUDA-graph replay (`triton.testing.do_bench_cudagraph`:
launch overhead excluded, as in the captured forward) and keeps the faster. The first eager run of
every shape is what a CUDA-graph capture is preceded by anyway (`GraphedForward`'s warm-up, the
engine's eager first round); a shape first seen *during* a capture cannot be timed (nor its kernel
autotuned) there, so it takes the fallback, with a warning. Off CUDA (the Triton interpreter) the fused
implementation always runs, so the tests exercise it.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from torch import Tensor


def _signature(args: tuple) -> tuple:
    return tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, Tensor) else a for a in args)


class FasterPerShape:
    """Call `fused` or `fallback` (same arguments, same result), whichever ran faster for this shape;
    `fallback` wherever `eligible(*args)` is False. `timings` records the measurements (ms):
    signature -> (fused, fallback)."""

    def __init__(self, fused: Callable[..., Any], fallback: Callable[..., Any],
                 eligible: Callable[..., bool], name: str) -> None:
        self.fused, self.fallback, self.eligible, self.name = fused, fallback, eligible, name
        self.timings: dict[tuple, tuple[float, float]] = {}

    def __call__(self, *args: Any) -> Any:
        if not self.eligible(*args):
            return self.fallback(*args)
        first = next(a for a in args if isinstance(a, Tensor))
        if first.device.type != "cuda":
            return self.fused(*args)
        key = _signature(args)
        if key not in self.timings:
            if torch.cuda.is_current_stream_capturing():
                warnings.warn(f"{self.name}: shape {tuple(first.shape)} first seen during CUDA-graph capture (no eager "
                              "warm-up): the unfused path is captured", stacklevel=2)
                return self.fallback(*args)
            self.timings[key] = self._time(args)
        fused_ms, fallback_ms = self.timings[key]
        return (self.fused if fused_ms < fallback_ms else self.fallback)(*args)

    @staticmethod
    def _time_one(fn: Callable[..., Any], args: tuple) -> float:
        from triton.testing import do_bench_cudagraph

        fn(*args)  # JIT and autotune, eagerly, before the timing graph is captured
        torch.cuda.synchronize()
        return do_bench_cudagraph(lambda: fn(*args), rep=10, return_mode="median")

    def _time(self, args: tuple) -> tuple[float, float]:
        torch.cuda.current_stream().synchronize()  # the inputs are ready before another stream reads them
        return self._time_one(self.fused, args), self._time_one(self.fallback, args)

    def choices(self) -> list[dict]:
        """One row per timed shape: the tensor arguments' shapes, both times, which one runs."""
        return [{"op": self.name, "shapes": [list(a[0]) for a in key if isinstance(a, tuple)], "fused_ms": f,
                 "fallback_ms": b, "uses": "fused" if f < b else "fallback"} for key, (f, b) in self.timings.items()]
