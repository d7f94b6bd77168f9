"""Shared by the kernel sweeps (`bench_ranked_topk.py`, `bench_top_b_tree.py`, `bench_tree_ops.py`,
`bench_attention_plan.py`): time one variant by CUDA-graph replay after checking its result, print a shape's
variants, and keep the rows on disk after every shape (a sweep cut by its time limit keeps what it measured)."""

from __future__ import annotations

import json
import statistics
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


def graph_us_per_call(run: Callable[[], Any], calls: int, repeats: int) -> float:
    """Microseconds per call of a `run()` that makes `calls` calls: warmed up on a side stream (JIT, allocation),
    captured once in a CUDA graph, then the median of `repeats` replays timed by CUDA events, divided by `calls`
    (a launch-bound op's cost in a graph, the gaps between its kernels included)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)
