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


def _scalar_tensor_index(index: object) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dim() == 0 and not i.is_floating_point() and i.dtype != torch.bool
               for i in items)


SCALAR_READS = ("item", "__int__", "__float__", "__bool__", "__index__")
"""Tensor methods that turn a value into a Python scalar. Under `torch.inference_mode()` (the engine's
decode loop) `_local_scalar_dense` does not reach the dispatch mode, so they are wrapped as well."""


@contextmanager
def no_host_reads() -> Iterator[None]:
    """Fail on host reads (see the module docstring); `Tensor.tolist`, the scalar conversions
    (`SCALAR_READS`) and indexing with a 0-d integer tensor (which PyTorch turns into a Python int)
    are caught by wrapping them for the duration."""
    tolist, getitem, setitem = torch.Tensor.tolist, torch.Tensor.__getitem__, torch.Tensor.__setitem__
    scalars = {name: getattr(torch.Tensor, name) for name in SCALAR_READS}

    def no_tolist(self: torch.Tensor):  # type: ignore[no-untyped-def]
        raise HostRead("Tensor.tolist() reads the device back")

    def no_scalar(name: str):  # type: ignore[no-untyped-def]
        def read(self: torch.Tensor, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise HostRead(f"Tensor.{name}() reads the device back as a Python scalar")
        return read

    def checked_getitem(self: torch.Tensor, index):  # type: ignore[no-untyped-def]
        if _scalar_tensor_index(index):
            raise HostRead("indexing with a 0-d tensor reads it back as a Python int")
        return getitem(self, index)

    def checked_setitem(self: torch.Tensor, index, value):  # type: ignore[no-untyped-def]
        if _scalar_tensor_index(index):
            raise HostRead("indexing with a 0-d tensor reads it back as a Python int")
        return setitem(self, index, value)

    torch.Tensor.tolist = no_tolist  # type: ignore[method-assign]
    torch.Tensor.__getitem__ = checked_getitem  # type: ignore[method-assign]
    torch.Tensor.__setitem__ = checked_setitem  # type: ignore[method-assign]
    for name in SCALAR_READS:
        setattr(torch.Tensor, name, no_scalar(name))
    try:
        with _NoHostReads():
            yield
    finally:
        torch.Tensor.tolist, torch.Tensor.__getitem__, torch.Tensor.__setitem__ = tolist, getitem, setitem  # type: ignore[method-assign]
        for name, fn in scalars.items():
            setattr(torch.Tensor, name, fn)
