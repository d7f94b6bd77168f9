"""Running the foresight pass beside the verify forward (methods.md §5.1 item 8), and the draft model's
own device.

`Pipeline` is the hand-off. Concurrent (CUDA): the pass runs on a second stream of the draft device.
  fork()    at the end of drafting, an event on the draft device's current stream: everything the
            pass reads (the block's tokens, the committed states) is enqueued before it;
  launch()  after the engine has enqueued the verify forward: the side stream waits on the fork
            event (not on the verify forward), runs the pass, records `done`; the tensors the pass
            reads are held until the join so the allocator cannot hand their memory to another
            stream while the pass may still read it;
  to_host() a small result (the selected outcomes) copied to pinned memory on the side stream, with
            its own event, so the host can test for a hit without waiting for the whole pass;
  join()    before the drafter next touches its state (observe) or a cached block: the current
            stream waits for `done` (a device-side wait, no host block).
Sequential (the CPU, or `pipeline=sequential`): launch runs the pass inline, fork/join do nothing;
the results are the same.

The draft device (`draft_device`, e.g. cuda:1): the drafter keeps its head, adapter, caches and a
copy of the target's weights (`target_copy`, the whole model: the drafter reads its embedding, LM
head, RoPE and the decoder slice's layers, the `true` state oracle every layer) on that device. What crosses devices is
explicit: the committed positions' tapped states (target -> draft, `to_draft`) and the drafted tree,
which the engine copies into its own buffers on the target's device.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from specbench.models.decoder import Transformer
from specbench.models.graphs import distinct_stream, graph_capture_stream
from specbench.models.target import TargetModel

PIPELINES = ("auto", "sequential", "concurrent")


def resolve_device(device: str | torch.device | None, default: torch.device) -> torch.device:
    """A device with its index filled in (cuda -> cuda:<current>), so equal devices compare equal."""
    dev = torch.device(device) if device is not None else default
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def target_copy(target: TargetModel, device: torch.device) -> TargetModel:
    """The target's model with its own weights on `device` (same dtype, attention backend and
    element-wise ops): the draft device's view of the target. Built on the meta device and filled
    from the target's tensors, so the copy never exists twice on the target's device."""
    src = target.model
    with torch.device("meta"):
        model = Transformer(src.config, attention=src.attention)
    model.load_state_dict({k: v.to(device, copy=True) for k, v in src.state_dict().items()}, assign=True)
    if src.config.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.inv_freq = src.inv_freq.to(device, copy=True)
    model.set_fused(src.fused_level)
    model.eval().requires_grad_(False)
    return TargetModel(name=target.name, model=model, tokenizer=target.tokenizer, fingerprint=target.fingerprint,
                       eos_token_ids=target.eos_token_ids, meta=dict(target.meta))


class Pipeline:
    """The foresight pass's hand-off (module docstring). `concurrent` needs a CUDA draft device."""

    def __init__(self, device: torch.device, mode: str = "auto") -> None:
        if mode not in PIPELINES:
            raise ValueError(f"pipeline must be one of {PIPELINES}, got {mode!r}")
        cuda = device.type == "cuda"
        if mode == "concurrent" and not cuda:
            raise ValueError(f"pipeline=concurrent needs a CUDA draft device, not {device}: use pipeline=sequential")
        self.device = device
        self.concurrent = cuda and mode != "sequential"
        # a stream that is not the one graphs are captured on by default (the host round's verify forward
        # replays such a graph beside this stream's eager work: each needs its own library scratch)
        self.side = distinct_stream(device, [graph_capture_stream()]) if self.concurrent else None
        self._fork: Any = None
        self._done: Any = None
        self._held: tuple[Any, ...] = ()
        self._pinned: Tensor | None = None

    def fork(self) -> None:
        """Mark the point on the draft device's current stream the next pass may start from."""
        if self.concurrent:
            self._fork = torch.cuda.Event()
            self._fork.record(torch.cuda.current_stream(self.device))

    def launch(self, fn: Callable[[], Any], *reads: Any) -> Any:
        """Run the pass `fn` (on the side stream after the fork point, or inline); `reads`: tensors it
        reads that were made on another stream (held until the join)."""
        if not self.concurrent:
            return fn()
        assert self.side is not None and self._fork is not None, "launch() without fork()"
        self._held = reads
        with torch.cuda.device(self.device), torch.cuda.stream(self.side):
            self.side.wait_event(self._fork)
            out = fn()
            self._done = torch.cuda.Event()
            self._done.record(self.side)
        self._fork = None
        return out

    def to_host(self, x: Tensor) -> tuple[Tensor, Any]:
        """(host copy of x, an event to wait on before reading it; None when already there). Inside
        `fn` on the side stream: the copy is ordered after what computes x."""
        if not self.concurrent:
            return x.cpu(), None
        host = self._pinned  # reused: the previous copy was waited on before the next pass was launched
        if host is None or host.shape != x.shape or host.dtype != x.dtype:
            host = self._pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        host.copy_(x, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))
        return host, ready

    @staticmethod
    def wait_host(ready: Any) -> None:
        if ready is not None:
            ready.synchronize()

    def join(self) -> None:
        """The draft device's current stream waits for the last pass (no host block)."""
        if self._done is not None:
            torch.cuda.current_stream(self.device).wait_event(self._done)
            self._done = None
        self._held = ()

    def to_draft(self, x: Tensor) -> Tensor:
        """A tensor from the target's device onto the draft device (a no-op when they are one)."""
        return x.to(self.device, non_blocking=True)
