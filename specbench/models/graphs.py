"""CUDA-graph replay: the target forward at fixed token counts, and a round's stages in sequence.

A model as small as SmolLM2 is bound by kernel launches, not bytes (30 layers x ~10 kernels per step):
capturing the forward once per static shape and replaying it removes that. Shapes are made static by
padding: a tree of n < N nodes is padded to the bucket size N with inert nodes that attend only to
themselves and that no real node attends to; their K/V land in cache slots past the real nodes, which
`KVCache.commit` never keeps. The forward reads the whole cache (kv_len = None) with the committed
lengths taken from the device tensor, so one graph serves every context length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from specbench.models.decoder import ForwardOutput, KVCache, Transformer


def distinct_stream(device: torch.device | None, avoid: Sequence[torch.cuda.Stream]) -> torch.cuda.Stream:
    """A stream of `device` that is none of `avoid`. `torch.cuda.Stream()` hands out PyTorch's pooled
    streams round-robin (32 per priority and device), so two calls, or a call and the stream that
    `torch.cuda.graph` captures on by default, can return the same CUDA stream; work that must run
    side by side needs streams known to differ (libraries keep scratch per stream: see `SideStage`)."""
    taken = {s.cuda_stream for s in avoid}
    for _ in range(65):  # two rounds of a pool
        stream = torch.cuda.Stream(device=device)
        if stream.cuda_stream not in taken:
            return stream
    raise RuntimeError(f"no CUDA stream of {device} outside {len(taken)} taken ones")


def graph_capture_stream() -> torch.cuda.Stream:
    """The stream `torch.cuda.graph` captures on when given none (made on first use)."""
    return torch.cuda.graph(torch.cuda.CUDAGraph()).capture_stream


def pad_tree_inputs(tokens: Tensor, positions: Tensor, tree_mask: Tensor, size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Pad [B, n] tokens/positions and a [B, n, n] mask to `size` with inert nodes (token 0, the last
    real position, attending only to themselves)."""
    b, n = tokens.shape
    if n == size:
        return tokens, positions, tree_mask
    if n > size:
        raise ValueError(f"{n} tree nodes do not fit a graph bucket of {size}")
    pad = size - n
    tokens = torch.cat([tokens, tokens.new_zeros(b, pad)], dim=1)
    positions = torch.cat([positions, positions[:, -1:].expand(b, pad)], dim=1)
    mask = torch.zeros(b, size, size, dtype=torch.bool, device=tree_mask.device)
    mask[:, :n, :n] = tree_mask
    idx = torch.arange(n, size, device=tree_mask.device)
    mask[:, idx, idx] = True
    return tokens, positions, mask


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    tokens: Tensor  # [B, N] static input buffers
    positions: Tensor
    tree_mask: Tensor
    out: ForwardOutput  # static outputs


class GraphedForward:
    """`forward(tokens, positions, tree_mask)` for one model + cache + taps, replayed from CUDA graphs
    captured lazily per bucket size (the smallest bucket >= n nodes)."""

    def __init__(self, model: Transformer, cache: KVCache, buckets: Sequence[int], taps: Sequence[int] = (),
                 num_layers: int | None = None) -> None:
        if model.embed.weight.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.model, self.cache = model, cache
        self.buckets = sorted(set(int(b) for b in buckets))
        self.taps, self.num_layers = tuple(taps), num_layers
        self.graphs: dict[int, _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def bucket(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"{n} tokens exceed the largest graph bucket {self.buckets[-1]}")

    def _capture(self, size: int) -> _Graph:
        dev = self.model.embed.weight.device
        b = self.cache.batch
        tokens = torch.zeros(b, size, dtype=torch.long, device=dev)
        positions = torch.zeros(b, size, dtype=torch.long, device=dev)
        mask = torch.eye(size, dtype=torch.bool, device=dev)[None].expand(b, size, size).contiguous()
        saved = self.cache.lengths.clone()
        run = lambda: self.model(tokens, positions, self.cache, mask, self.taps, num_layers=self.num_layers)  # noqa: E731
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):  # warm-up (allocator, lazy init) outside the graph
                run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool), torch.inference_mode():
            out = run()
        self.cache.lengths.copy_(saved)  # capture wrote dummy K/V past the committed prefix only
        return _Graph(graph, tokens, positions, mask, out)

    @torch.inference_mode()
    def __call__(self, tokens: Tensor, positions: Tensor, tree_mask: Tensor) -> ForwardOutput:
        n = tokens.shape[1]
        size = self.bucket(n)
        g = self.graphs.get(size)
        if g is None:
            g = self.graphs[size] = self._capture(size)
        t, p, m = pad_tree_inputs(tokens, positions, tree_mask, size)
        g.tokens.copy_(t)
        g.positions.copy_(p)
        g.tree_mask.copy_(m)
        g.graph.replay()
        return ForwardOutput(logits=g.out.logits[:, :n], hidden={k: v[:, :n] for k, v in g.out.hidden.items()})


Stage = tuple[str, Callable[[Any], Any]]
"""(stage name, step): each step maps the previous step's output to the next (the first gets the
chain's input)."""


@dataclass(frozen=True)
class Constant:
    """A step with no device work: it returns the same static value every round (AR's draft stage, the
    anchor's one-node tree). `StageGraphs` captures no graph for it: an empty capture warns ("The CUDA
    Graph is empty") and its replay would still cost a launch."""

    value: Any

    def __call__(self, _: Any) -> Any:
        return self.value


@dataclass
class SideStage:
    """Stage `name` of a chain replayed on a second stream: it starts from the point on the main
    stream before stage `fork` (it waits for what precedes `fork`, not for `fork` itself) and the main
    stream waits for it before stage `join` (the wait is marked as part of `name`: its exposed time).
    It runs while the main stream's graphs run, so it is captured in a memory pool of its own and on
    its own stream (what libraries keep per stream, cuBLAS's workspace, is then its own too). Each
    replay records its own span on the side stream (`span`: CUDA timing events, read after a sync)."""

    name: str
    fork: str
    join: str
    stream: torch.cuda.Stream
    span: tuple[torch.cuda.Event, torch.cuda.Event] | None = None  # the last replay's


class StageGraphs:
    """A chain of steps captured as one CUDA graph each, sharing a memory pool, and replayed in order
    (a `side` stage on its own stream, see `SideStage`).

    Capture records the steps without running them, so it has no effect on device state; each step's
    outputs are static tensors that the next step's graph reads, and the chain's input must itself be
    static (the same tensors every replay). Host-side effects of a step (Python counters, cached
    properties) happen once, at capture: the steps must be pure device work after their first eager
    run, which is what warms them up (Triton JIT, allocator, library handles) before `capture`.
    """

    def __init__(self, stages: Sequence[Stage], first_input: Any, side: SideStage | None = None) -> None:
        self.names = [name for name, _ in stages]
        if side is not None and not {side.name, side.fork, side.join} <= set(self.names):
            raise ValueError(f"side stage {side.name!r} (fork {side.fork!r}, join {side.join!r}) not in {self.names}")
        if side is not None and isinstance(dict(stages)[side.name], Constant):
            raise ValueError(f"side stage {side.name!r} is a Constant: it has no work to run beside the chain")
        self.side = side
        self.graphs: list[torch.cuda.CUDAGraph | None] = []  # None: a `Constant` step
        self.outputs: list[Any] = []
        pool, own = torch.cuda.graph_pool_handle(), torch.cuda.graph_pool_handle()
        # with a side stage the chain is captured on a stream known to differ from the side stage's, which
        # is captured on its own: library scratch is kept per stream (cuBLAS's split-K workspace), so graphs
        # captured on one stream share it and race when replayed side by side (seen on the H200: wrong
        # GEMMs and NaN logits in the pipelined jetspec++ round; `scripts/foresight_divergence.py`)
        main = distinct_stream(side.stream.device, [side.stream]) if side is not None else None
        x = first_input
        with torch.inference_mode():
            for name, step in stages:
                if isinstance(step, Constant):
                    x = step(x)
                    self.graphs.append(None)
                    self.outputs.append(x)
                    continue
                graph = torch.cuda.CUDAGraph()
                on_side = side is not None and name == side.name
                with torch.cuda.graph(graph, pool=own if on_side else pool, stream=side.stream if on_side else main):  # type: ignore[union-attr]
                    x = step(x)
                self.graphs.append(graph)
                self.outputs.append(x)

    def replay(self, mark: Callable[[str], None]) -> Any:
        """Replay every step; `mark(name)` is called before each (stage boundaries for timing).
        Returns the last step's (static) output."""
        side, fork, done = self.side, None, None
        for name, graph in zip(self.names, self.graphs):
            if side is not None and name == side.join and done is not None:
                torch.cuda.current_stream().wait_event(done)
            mark(name)
            if side is not None and name == side.fork:
                fork = torch.cuda.Event()
                fork.record()
            if side is not None and name == side.name:
                assert fork is not None, f"side stage {name!r} comes before its fork {side.fork!r}"
                start, end, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), torch.cuda.Event()
                with torch.cuda.stream(side.stream):
                    side.stream.wait_event(fork)
                    start.record()
                    graph.replay()
                    end.record()
                    done.record()
                side.span = (start, end)
            elif graph is not None:
                graph.replay()
        return self.outputs[-1]
