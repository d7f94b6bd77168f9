"""The two tree ops of a round that became one Triton launch each, against the tensor ops they replace, in
CUDA graphs as the round replays them: a tree's ancestor mask (`kernels/ancestor_mask.py` against pointer
doubling, every tree round's verify forward) and a scored candidate tree's top nodes (`kernels/select_top.py`,
one program or two launches, against `select_top_scores`' sort and index ops: prompt lookup's tree stage,
eagle3's final selection).

    python scripts/bench_tree_ops.py [--repeats 200] [--json F]      # a CUDA machine (~30 s)

Each case is first checked equal to the tensor ops on the same input, then each version is captured in one
CUDA graph holding `--inner` calls; the time is the median over `--repeats` replays (CUDA events, after
warm-up) divided by `--inner`: a launch-bound op's cost in a graph, gaps between kernels included.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import torch

from specbench.kernels.ancestor_mask import ancestor_mask
from specbench.kernels.masks import ancestor_masks
from specbench.kernels.select_top import ONE_PROGRAM_MAX_NODES, select_top
from specbench.trees.base import DraftTree, select_top_scores, select_top_scores_ops

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_variants import graph_us_per_call  # noqa: E402


def random_tree(n: int, max_back: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(parents [n], depth [n]) of a random tree whose node i hangs below one of the `max_back` nodes before it."""
    parents, depth = [-1], [0]
    for i in range(1, n):
        p = int(torch.randint(max(0, i - max_back), i, (1,), generator=g))
        parents.append(p)
        depth.append(depth[p] + 1)
    return torch.tensor(parents), torch.tensor(depth)


def graph_time(fn: Callable[[], object], repeats: int, inner: int) -> float:
    """Microseconds per call of `fn`, replayed from a CUDA graph of `inner` calls (median of `repeats`)."""
    return graph_us_per_call(lambda: [fn() for _ in range(inner)], inner, repeats)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--inner", type=int, default=20, help="calls per captured graph")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_tree_ops: needs a CUDA device (on the CPU the kernels run only interpreted)")
    dev, g, rows = torch.device("cuda"), torch.Generator().manual_seed(0), []
    for n, max_back in ((17, 2), (65, 6), (257, 16)):  # ddtree-like trees of budgets 16, 64, 256
        parents, depth = random_tree(n, max_back, g)
        bound = int(depth.max())
        par = parents.to(dev)
        assert torch.equal(ancestor_mask(par), ancestor_masks(par, bound)), f"ancestor mask differs at N = {n}"
        rows.append({"op": "ancestor mask", "nodes": n, "depth": bound,
                     "tensor_ops_us": graph_time(lambda: ancestor_masks(par, bound), args.repeats, args.inner),
                     "kernel_us": graph_time(lambda: ancestor_mask(par), args.repeats, args.inner)})
    selects = [(8 * b + 1, b) for b in (16, 24, 32, 48, 64)]  # prompt lookup's trie: 8 matches x budget + the root
    selects.append((711, 64))  # eagle3's candidates at eagle2's defaults (10 beams, 8 frontiers)
    for n, budget in selects:
        parents, depth = random_tree(n, budget, g)
        step = torch.rand(n, generator=g)
        scores = torch.zeros(n)
        for i in range(1, n):
            scores[i] = scores[int(parents[i])] - step[i]
        tree = DraftTree(tokens=torch.randint(0, 49152, (n,), generator=g).to(dev), parents=parents.to(dev),
                         depth=depth.to(dev), scores=scores.to(dev))
        arrays = (tree.tokens, tree.parents, tree.depth, tree.scores)
        want = DraftTree(*(t.cpu() for t in arrays[:3]), scores=scores)  # the tensor ops, on the CPU
        for one in (True, False):
            got = select_top(*arrays, budget, one_program=one)
            assert all(torch.equal(a.cpu(), getattr(select_top_scores(want, budget), f))
                       for a, f in zip(got, ("tokens", "parents", "depth", "scores"))), f"select differs at N = {n}"
        row = {"op": "select top", "nodes": n, "budget": budget,
               "tensor_ops_us": graph_time(lambda: select_top_scores_ops(tree, budget), args.repeats, args.inner)}
        for one, key in ((True, "one_program_us"), (False, "two_launch_us")):
            row[key] = graph_time(lambda one=one: select_top(*arrays, budget, one_program=one), args.repeats, args.inner)
        row["kernel_us"] = row["one_program_us" if n <= ONE_PROGRAM_MAX_NODES else "two_launch_us"]  # the default
        rows.append(row)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: us per call in a CUDA graph (median)")
    print("| op | nodes | tensor ops | kernel (default) | saved | select: one program | two launches |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        split = f" {r['one_program_us']:.2f} | {r['two_launch_us']:.2f} |" if "one_program_us" in r else " | |"
        print(f"| {r['op']} | {r['nodes']} | {r['tensor_ops_us']:.2f} | {r['kernel_us']:.2f} | "
              f"{r['tensor_ops_us'] - r['kernel_us']:.2f} |{split}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
