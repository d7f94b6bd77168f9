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

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: the kernels' CUDA path on the CPU

import argparse
import contextlib
from collections import Counter
from typing import Any

import torch

from op_counter import OpCounter, charged
from round_ops import cuda_paths


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
                   help="count the CPU path's aten calls as kernels (default: the CUDA path's, as scripts/round_ops.py)")
    args = p.parse_args()
    torch.set_num_threads(1)
    count_foresight(args.preset, args.tree, args.J, args.R, args.B, args.rounds, args.top, args.reference_ops)


def count_foresight(preset: str, tree: str, J: int, R: int, B: int, rounds_counted: int, top: int,
                    reference_ops: bool = False) -> dict[str, Any]:
    """Print and return the foresight stage's mean aten calls and kernels per round by part ({part: (calls,
    kernels)}, and "draft stage": the critical path's drafting) over `rounds_counted` rounds."""
    from specbench.config import SpecConfig
    from specbench.drafters.jetspecpp import device_foresight, foresight
    from specbench.drafters.jetspecpp.device_states import DeviceStates
    from specbench.drafters.jetspecpp.decoder import SliceDecoder
    from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
    from specbench.engine import SpecDecoder
    from specbench.models import load_target

    policy, budget = tree.split(":")[0], int(tree.split(":")[1])
    target = load_target(f"random:{preset}", device="cpu", dtype="float32")
    drafter = JetSpecPPDrafter(target, random_init=True, J=J, R=R, foresight="on", B=B, pipeline="sequential")
    dec = SpecDecoder(target, SpecConfig(drafter="jetspec++", tree=policy, budget=budget), max_seq_len=256,
                      drafter=drafter)
    assert dec.branching, "the device round's foresight does not run in this configuration"
    fs = drafter.device_foresight
    assert fs is not None
    counter = OpCounter()
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
        with torch.inference_mode(), charged(counter, parts), contextlib.ExitStack() as paths:
            if not reference_ops:  # the CUDA path's launches (round_ops: each Triton kernel stubbed, counted once)
                paths.enter_context(cuda_paths(counter, target, dec.policy, "elementwise"))
            with counter:
                dec.generate(prompt, 2 + rounds_counted)  # random weights: one token a round
    finally:
        del fs.run, drafter.refined_logp
    rounds = per_round[1:] or per_round  # the first round's stage also allocates the buffers
    assert rounds, "no foresight stage ran"
    draft = draft_counts[1:] or draft_counts
    keys = set().union(*(r for r, _, _ in rounds))
    mean = {k: sum(r[k] for r, _, _ in rounds) / len(rounds) for k in keys}
    kmean = {k: sum(r[k] for _, _, r in rounds) / len(rounds) for k in keys}
    print(f"{preset} {tree} J{J} R{R} B{B}: per round over {len(rounds)} rounds, "
          f"aten calls | kernels ({'the CPU path' if reference_ops else 'the CUDA path: not views, one per Triton launch'})")
    order = ["P̂: tree states", "P̂: decoder read", "P̂: rows", "selection", "setup", "blocks", "builds",
             "keys and copies"]
    for k in order:
        if k in mean:
            print(f"  {k:<18} {mean[k]:8.1f} | {kmean[k]:7.1f}")
    print(f"  {'foresight stage':<18} {sum(mean.values()):8.1f} | {sum(kmean.values()):7.1f}")
    print(f"  {'draft stage':<18} {sum(c for c, _ in draft) / len(draft):8.1f} | {sum(c for _, c in draft) / len(draft):7.1f}"
          f"  (the critical path's drafting, for scale)")
    for k in order if top else ():
        names: Counter[str] = sum((n.get(k, Counter()) for _, n, _ in rounds), Counter())
        if names:
            print(f"  [{k}] " + ", ".join(f"{n} {c / len(rounds):.0f}" for n, c in names.most_common(top)))
    counts = {k: (mean[k], kmean[k]) for k in order if k in mean}
    counts["draft stage"] = (sum(c for c, _ in draft) / len(draft), sum(c for _, c in draft) / len(draft))
    return counts


if __name__ == "__main__":
    main()
