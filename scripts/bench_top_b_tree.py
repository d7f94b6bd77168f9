"""Time the top-B tree kernel (`specbench.kernels.top_b_tree`, one program per tree, serial over depths) at
several warp counts on the GPU, each first checked equal to the default launch's tree.

    python scripts/bench_top_b_tree.py [--out FILE.json]

Its call was 54.7 us of dflash/ddtree/64's ~0.3 ms of non-forward round time on the H200 (docs/measurements,
2026-12-02); the program's work per depth is one partial bitonic network over the candidate pairs
((place+1)(rank+1) <= B: 303 of them at B = 64), so how many threads share it is the knob. Tables are
log-probs of random logits ranked per depth, as ddtree's; shapes: ddtree/16, ddtree/64 and ddtree/256 (15
depths), and jetspec++'s foresight batch (16 trees of budget 16). Times are CUDA-graph replays
(`triton.testing.do_bench_cudagraph`, median).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_variants import measure, report, save  # noqa: E402

SHAPES = [(16, 15, 1, "ddtree/16"), (64, 15, 1, "ddtree/64"), (256, 15, 1, "ddtree/256"),
          (16, 15, 16, "foresight 16 x ddtree/16")]
WARPS = (1, 2, 4, 8, 16)


def table(budget: int, depth: int, trees: int, vocab: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens, log-probs [trees, depth, min(budget, vocab)] ranked per depth (descending log-prob)."""
    lp = torch.log_softmax(4 * torch.randn(trees, depth, vocab, generator=g), -1)
    vals, ids = lp.topk(min(budget, vocab), dim=-1)
    return ids.cuda(), vals.cuda()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--vocab", type=int, default=49152)
    args = p.parse_args()
    from specbench.kernels.top_b_tree import TopBTree

    g = torch.Generator().manual_seed(0)
    rows = []
    for budget, depth, trees, what in SHAPES:
        tok, lp = table(budget, depth, trees, args.vocab, g)
        anchors = torch.arange(trees, device="cuda")
        want = TopBTree(budget, lp.shape[-1], lp.device).batch(anchors, tok, lp)
        line = {"budget": budget, "depth": depth, "trees": trees, "what": what}
        for w in WARPS:
            kernel = TopBTree(budget, lp.shape[-1], lp.device, num_warps=w)
            line[f"warps {w}"] = measure(lambda k=kernel: k.batch(anchors, tok, lp),
                                         lambda got: all(torch.equal(a, b) for a, b in zip(got, want)))
        rows.append(line)
        report(f"{what} (B {budget}, {depth} depths, {trees} tree(s))", line, [f"warps {w}" for w in WARPS], 9)
        save(args.out, rows)


if __name__ == "__main__":
    main()
