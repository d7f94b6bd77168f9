"""Aten calls and estimated CUDA kernels of a piece of the decode round, counted on the CPU: the proxy
for what a captured stage replays one launch at a time on the GPU (launch-bound there, ~3.5-7 us a
kernel in a CUDA graph). Shared by scripts/foresight_ops.py and scripts/round_ops.py.

A kernel is an aten call that is not a view of an input, a no-op cast or an uninitialised allocation
(`_aliases`), or one Triton launch. Where the CPU and CUDA code paths differ, `shadow` runs the CPU
path for the values (not counted) and the CUDA path for the count, under the Triton interpreter with
every launch stubbed: counted as one kernel and not executed (interpreting a whole forward would take
minutes); the values go on in the CUDA path's output tensors (its strides).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode


ALLOCATIONS = {"empty", "empty_like", "new_empty", "empty_strided"}  # memory only, no kernel


class OpCounter(TorchDispatchMode):
    """Counts aten calls, charged to the innermost `part` open (None outside every part)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str | None] = [None]
        self.counts: Counter[str | None] = Counter()
        self.names: dict[str | None, Counter[str]] = {}  # kernels by op name
        self.kernels: Counter[str | None] = Counter()  # calls that are not views (or no-op casts) of an input
        self.fused = 0  # inside a layer op counted as fused kernels
        self.silent = 0  # inside the CPU path of a `shadow`: nothing counted
        self.cuda_path = 0  # inside the CUDA path of a `shadow`: Triton launches stubbed

    def reset(self) -> None:
        self.counts, self.names, self.kernels = Counter(), {}, Counter()

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Charge calls to `name` until closed; inside another part only if that part is open (`parts`)."""
        self.parts.append(name)
        try:
            yield
        finally:
            self.parts.pop()

    def charge(self, name: str, kernels: int = 1) -> None:
        """`kernels` launches of `name` (not an aten call) to the innermost part."""
        where = self.parts[-1]
        self.counts[where] += kernels
        self.kernels[where] += kernels
        self.names.setdefault(where, Counter())[name] += kernels

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        where = self.parts[-1]
        out = func(*args, **(kwargs or {}))
        if self.silent:
            return out
        self.counts[where] += 1
        if not self.fused and not _aliases(func, args, out):
            self.kernels[where] += 1
            self.names.setdefault(where, Counter())[func.overloadpacket.__name__] += 1
        return out

    def shadow(self, cpu: Callable, cuda: Callable) -> Callable:
        """A function returning `cpu`'s values (not counted; in `cuda`'s output tensors where their strides
        differ) and counting what `cuda` (same arguments) launches: its aten calls and one kernel per Triton
        launch (`stubbed_launches`, not run). Called
        inside the CUDA path of another shadow, only `cuda` runs; inside a CPU path, only `cpu`."""
        def call(*a: Any, **kw: Any) -> Any:
            if self.cuda_path:
                return cuda(*a, **kw)
            self.silent += 1
            try:
                out = cpu(*a, **kw)
            finally:
                self.silent -= 1
            if self.silent:
                return out
            self.cuda_path += 1
            try:
                laid_out = cuda(*a, **kw)
            finally:
                self.cuda_path -= 1
            return self._in_layout(out, laid_out)
        return call

    def _in_layout(self, out: Any, laid_out: Any) -> Any:
        """The CPU path's values in the CUDA path's output tensors (filled here, not counted), so the ops
        after a shadow see the CUDA path's strides (a transposed attention output reshapes as a view)."""
        if isinstance(out, tuple) and isinstance(laid_out, tuple) and len(out) == len(laid_out):
            return tuple(self._in_layout(o, c) for o, c in zip(out, laid_out))
        if not (isinstance(out, torch.Tensor) and isinstance(laid_out, torch.Tensor)) or out.shape != laid_out.shape \
                or out.dtype != laid_out.dtype or out.stride() == laid_out.stride():
            return out
        self.silent += 1
        try:
            return laid_out.copy_(out)
        finally:
            self.silent -= 1

    @contextlib.contextmanager
    def stubbed_launches(self) -> Iterator[None]:
        """Under TRITON_INTERPRET=1: a Triton launch inside a shadow's CUDA path is counted as one kernel
        and not executed (elsewhere it runs in the interpreter as usual)."""
        from triton.runtime.interpreter import GridExecutor

        run = GridExecutor.__call__

        def launch(executor: Any, *a: Any, **kw: Any) -> Any:
            if not self.cuda_path:
                return run(executor, *a, **kw)
            if not self.silent:
                self.charge(f"triton:{executor.fn.__name__}")
            return None

        GridExecutor.__call__ = launch  # type: ignore[method-assign]
        try:
            yield
        finally:
            GridExecutor.__call__ = run  # type: ignore[method-assign]


def _aliases(func, args: tuple, out: Any) -> bool:  # type: ignore[no-untyped-def]
    """Whether the call launches no kernel on the GPU: a view of an input (a view op, or a cast / contiguous
    that was a no-op) or an uninitialised allocation. In-place ops write, so they count."""
    if func.overloadpacket.__name__ in ALLOCATIONS:
        return True
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if not any(isinstance(o, torch.Tensor) for o in outs):  # a dtype, shape or scalar: host work
        return True
    ret = func._schema.returns
    if not ret or ret[0].alias_info is None or ret[0].alias_info.is_write or not isinstance(out, torch.Tensor):
        return False
    ptr = out.untyped_storage().data_ptr()
    return any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr for a in args)


@contextlib.contextmanager
def charged(counter: OpCounter, parts: list[tuple[str | Callable[[], str], Any, str]]) -> Iterator[None]:
    """Wrap obj.attr (parts: (label, obj, attr)) so that its calls are charged to label (a string, or a
    function giving it at call time); restored after."""
    saved = []
    for label, obj, attr in parts:
        if not hasattr(obj, attr):  # an older tree without that function
            continue
        fn = getattr(obj, attr)
        saved.append((obj, attr, obj.__dict__.get(attr) if isinstance(obj, type) else None, fn))

        def wrapped(*a: Any, _fn: Callable = fn, _label: Any = label, **kw: Any) -> Any:
            if counter.parts[-1] is None:  # outside the counted stage: not charged
                return _fn(*a, **kw)
            with counter.part(_label() if callable(_label) else _label):
                return _fn(*a, **kw)

        setattr(obj, attr, staticmethod(wrapped) if isinstance(obj, type) and isinstance(
            obj.__dict__.get(attr), staticmethod) else wrapped)
    try:
        yield
    finally:
        for obj, attr, raw, fn in reversed(saved):
            setattr(obj, attr, raw if raw is not None else fn)


@contextlib.contextmanager
def swapped(pairs: list[tuple[Any, str, Callable]]) -> Iterator[None]:
    """obj.attr replaced by fn for each (obj, attr, fn) (a module's or a class's function); restored after."""
    saved = [(obj, attr, obj.__dict__[attr]) for obj, attr, _ in pairs]
    for obj, attr, fn in pairs:
        setattr(obj, attr, fn)
    try:
        yield
    finally:
        for obj, attr, raw in reversed(saved):
            setattr(obj, attr, raw)
