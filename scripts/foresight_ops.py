"""Aten calls per round of jetspec++'s device-round foresight stage, split by part (CPU, random weights
of a preset shape): a proxy for the kernels the captured stage replays one by one on the GPU, where
the stage is launch-bound (~3.5 us a kernel in a graph).

    python scripts/foresight_ops.py [--preset smollm2-135m-shape] [--tree chain:16] [--J 1 --R 1 --B 16]

Every aten call (views included) inside the stage is counted by a dispatch mode and charged to the
innermost part running: P̂ (the tree's predicted states, the decoder read, the calibrated rows),
selection, setup (the outcome batch's masks and context K/V), blocks (J0, refreshes, Jacobi passes),
builds (the B candidate trees), keys and copies (the rest). The draft stage (the critical path's
drafting, same drafter) is counted too, for scale. Random weights accept nothing: every round misses,
which is the foresight stage's work whatever the outcome.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections import Counter
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode


KERNELS = {"norm": 1, "qkv_rope": 1, "silu_mul": 1, "add_rmsnorm_linear": 2, "silu_mul_linear": 2}
"""Kernels per layer op on CUDA (`fused_ops`): one Triton kernel each; the two fused into a product count
as the element-wise kernel + cuBLAS (the "gemm" level fuses them into one where that is faster)."""


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

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        where = self.parts[-1]
        out = func(*args, **(kwargs or {}))
        self.counts[where] += 1
        if not self.fused and not _aliases(func, args, out):
            self.kernels[where] += 1
            self.names.setdefault(where, Counter())[func.overloadpacket.__name__] += 1
        return out

    def fused_ops(self, ops: Any) -> Any:
        """`ops` (a LayerOps of reference functions) with each call counted as the kernels the CUDA
        fused level launches for it (`KERNELS`) instead of its reference aten calls."""
        def one(name: str, fn: Callable) -> Callable:
            def call(*a: Any, **kw: Any) -> Any:
                self.kernels[self.parts[-1]] += KERNELS[name]
                self.names.setdefault(self.parts[-1], Counter())[name] += KERNELS[name]
                self.fused += 1
                try:
                    return fn(*a, **kw)
                finally:
                    self.fused -= 1
            return call
        return type(ops)(**{f.name: one(f.name, getattr(ops, f.name)) for f in dataclasses.fields(ops)})


def _aliases(func, args: tuple, out: Any) -> bool:  # type: ignore[no-untyped-def]
    """Whether the call launches no kernel on the GPU: a view of an input (a view op, or a cast / contiguous
    that was a no-op) or an uninitialised allocation. In-place ops write, so they count."""
    if func.overloadpacket.__name__ in ALLOCATIONS:
        return True
    ret = func._schema.returns
    if not ret or ret[0].alias_info is None or ret[0].alias_info.is_write or not isinstance(out, torch.Tensor):
        return False
    ptr = out.untyped_storage().data_ptr()
    return any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr for a in args)


@contextlib.contextmanager
def charged(counter: OpCounter, parts: list[tuple[str, Any, str]]) -> Iterator[None]:
    """Wrap obj.attr (parts: (label, obj, attr)) so that its calls are charged to label; restored after."""
    saved = []
    for label, obj, attr in parts:
        if not hasattr(obj, attr):  # an older tree without that function
            continue
        fn = getattr(obj, attr)
        saved.append((obj, attr, obj.__dict__.get(attr) if isinstance(obj, type) else None, fn))

        def wrapped(*a: Any, _fn: Callable = fn, _label: str = label, **kw: Any) -> Any:
            if counter.parts[-1] is None:  # outside the counted stage: not charged
                return _fn(*a, **kw)
            with counter.part(_label):
                return _fn(*a, **kw)

        setattr(obj, attr, staticmethod(wrapped) if isinstance(obj, type) and isinstance(
            obj.__dict__.get(attr), staticmethod) else wrapped)
    try:
        yield
    finally:
        for obj, attr, raw, fn in reversed(saved):
            setattr(obj, attr, raw if raw is not None else fn)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="smollm2-135m-shape")
    p.add_argument("--tree", default="chain:16", help="policy:budget (chain, ddtree-vec)")
    p.add_argument("--J", type=int, default=1)
    p.add_argument("--R", type=int, default=1)
    p.add_argument("--B", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3, help="rounds counted (after the first, eager one)")
    p.add_argument("--top", type=int, default=12, help="most frequent kernels listed per part (0: none)")
    p.add_argument("--reference-ops", action="store_true",
                   help="count the layer ops' reference aten calls as kernels too (default: as the CUDA fused level)")
    args = p.parse_args()
    torch.set_num_threads(1)

    from specbench.config import SpecConfig
    from specbench.drafters.jetspecpp import device_foresight, foresight
    from specbench.drafters.jetspecpp.device_states import DeviceStates
    from specbench.drafters.jetspecpp.decoder import SliceDecoder
    from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
    from specbench.engine import SpecDecoder
    from specbench.models import load_target

    policy, budget = args.tree.split(":")[0], int(args.tree.split(":")[1])
    target = load_target(f"random:{args.preset}", device="cpu", dtype="float32")
    drafter = JetSpecPPDrafter(target, random_init=True, J=args.J, R=args.R, foresight="on", B=args.B,
                               pipeline="sequential")
    dec = SpecDecoder(target, SpecConfig(drafter="jetspec++", tree=policy, budget=budget), max_seq_len=256,
                      drafter=drafter)
    assert dec.branching, "the device round's foresight does not run in this configuration"
    fs = drafter.device_foresight
    assert fs is not None
    counter = OpCounter()
    if not args.reference_ops:
        target.model.ops = counter.fused_ops(target.model.ops)
    per_round: list[tuple[Counter[str | None], dict[str | None, Counter[str]]]] = []
    stage_run, draft_logp = fs.run, drafter.refined_logp

    def counted_stage(*a: Any, **kw: Any) -> Any:
        counter.reset()
        with counter.part("keys and copies"):
            out = stage_run(*a, **kw)
        per_round.append((counter.counts.copy(), {k: v.copy() for k, v in counter.names.items()}, counter.kernels.copy()))
        return out

    draft_counts: list[tuple[int, int]] = []

    def counted_draft(*a: Any, **kw: Any) -> Any:
        counter.reset()
        with counter.part("draft stage"):
            out = draft_logp(*a, **kw)
        draft_counts.append((sum(counter.counts.values()), sum(counter.kernels.values())))
        return out

    parts = [("P̂: tree states", DeviceStates, "plan"), ("P̂: tree states", DeviceStates, "block"), ("P̂: decoder read", SliceDecoder, "read"),
             ("P̂: rows", device_foresight.DeviceForesight, "decoder_law"), ("selection", device_foresight, "select"),
             ("setup", foresight.OutcomeBatch, "__init__"), ("blocks", foresight.OutcomeBatch, "refined_logp"),
             ("builds", type(dec.policy), "build"), ("builds", type(dec.policy), "build_batch")]
    prompt = torch.randint(0, target.config.vocab_size, (32,), generator=torch.Generator().manual_seed(0)).tolist()
    fs.run, drafter.refined_logp = counted_stage, counted_draft  # type: ignore[method-assign]
    try:
        with torch.inference_mode(), charged(counter, parts), counter:
            dec.generate(prompt, 2 + args.rounds)  # random weights: one token a round
    finally:
        del fs.run, drafter.refined_logp
    rounds = per_round[1:] or per_round  # the first round's stage also allocates the buffers
    assert rounds, "no foresight stage ran"
    draft = draft_counts[1:] or draft_counts
    keys = set().union(*(r for r, _, _ in rounds))
    mean = {k: sum(r[k] for r, _, _ in rounds) / len(rounds) for k in keys}
    kmean = {k: sum(r[k] for _, _, r in rounds) / len(rounds) for k in keys}
    print(f"{args.preset} {args.tree} J{args.J} R{args.R} B{args.B}: per round over {len(rounds)} rounds, "
          f"aten calls (CPU) | kernels ({'not views' if args.reference_ops else 'not views, a layer op as its CUDA kernels'})")
    order = ["P̂: tree states", "P̂: decoder read", "P̂: rows", "selection", "setup", "blocks", "builds",
             "keys and copies"]
    for k in order:
        if k in mean:
            print(f"  {k:<18} {mean[k]:8.1f} | {kmean[k]:7.1f}")
    print(f"  {'foresight stage':<18} {sum(mean.values()):8.1f} | {sum(kmean.values()):7.1f}")
    print(f"  {'draft stage':<18} {sum(c for c, _ in draft) / len(draft):8.1f} | {sum(c for _, c in draft) / len(draft):7.1f}"
          f"  (the critical path's drafting, for scale)")
    if args.top:
        for k in order:
            names: Counter[str] = sum((n.get(k, Counter()) for _, n, _ in rounds), Counter())
            if names:
                print(f"  [{k}] " + ", ".join(f"{n} {c / len(rounds):.0f}" for n, c in names.most_common(args.top)))


if __name__ == "__main__":
    main()
