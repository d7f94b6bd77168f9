"""The pending part of a residual stream that is added already (no Triton import: the decoder checks for it)."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class RowStats(NamedTuple):
    """A residual stream (x, pending) whose pending part is added already: x is the whole stream, and these are its
    rows' sums of squares by column tile [M, T] float32 (`specbench.kernels.norm_stats.linear_residual`), which the
    norm after it uses instead of reading the stream again."""

    sumsq: Tensor
