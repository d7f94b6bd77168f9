"""Shared by the kernel sweeps (`bench_ranked_topk.py`, `bench_top_b_tree.py`): time one variant by CUDA-graph replay
after checking its result, print a shape's variants, and keep the rows on disk after every shape (a sweep cut by its
time limit keeps what it measured)."""

from __future__ import annotations

import json
from typing import Any, Callable

import torch


def measure(fn: Callable[[], Any], check: Callable[[Any], bool]) -> dict:
    """{"us": median us of a CUDA-graph replay of fn(), "equal": check(fn())}, or {"error": ...} for a variant that
    does not compile or fit on this device."""
    from triton.testing import do_bench_cudagraph

    try:
        ok = bool(check(fn()))
        torch.cuda.synchronize()
        return {"us": round(1000 * do_bench_cudagraph(fn, rep=50, return_mode="median"), 2), "equal": ok}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def report(title: str, line: dict, names: list[str], width: int = 32) -> None:
    print(f"{title}:")
    for name in names:
        r = line[name]
        print(f"   {name:{width}s} " + (f"{r['us']:8.1f} us  equal={r['equal']}" if "us" in r else r["error"]))


def save(out: str | None, rows: list[dict]) -> None:
    if out:
        with open(out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
