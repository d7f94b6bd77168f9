"""A CPU stand-in for CUDA-graph capture's rule: no host read of device data and no host data copied in.

Inside `no_host_reads()` an op whose result depends on tensor values on the host (`.item()`, `int()`,
`bool()`, `.tolist()`, `nonzero`, `unique`, boolean-mask indexing, `torch.equal`) or that builds a tensor
from host data (`torch.tensor(list)`) raises `HostRead`: such a step could not be captured in a CUDA
graph (capture records kernels without running them, so nothing can be read back, and host data
copied in at capture would be replayed stale). Shapes, dtypes and devices may be read freely.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

FORBIDDEN = {"_local_scalar_dense", "nonzero", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
             "masked_select", "lift_fresh", "equal", "allclose", "is_nonzero", "repeat_interleave_self_tensor"}


class HostRead(RuntimeError):
    pass


class _NoHostReads(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        if name in FORBIDDEN:
            raise HostRead(f"{func} reads the device back or copies host data in")
        if name in ("index", "index_put", "index_put_") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ())):
            raise HostRead(f"{func} with a boolean mask has a data-dependent shape")
        return func(*args, **(kwargs or {}))


@contextmanager
def no_host_reads() -> Iterator[None]:
    original = torch.Tensor.tolist

    def tolist(self: torch.Tensor):  # type: ignore[no-untyped-def]
        raise HostRead("Tensor.tolist() reads the device back")

    torch.Tensor.tolist = tolist  # type: ignore[method-assign]
    try:
        with _NoHostReads():
            yield
    finally:
        torch.Tensor.tolist = original  # type: ignore[method-assign]
