"""Tree-building time per round for every tree policy, next to one target verify pass at the same budget.

    python scripts/bench_trees.py                        # this CPU: SmolLM2 fp32, budgets 16 64 256 1024
    SPECBENCH_CACHE=/tmp/sbc PYTHONPATH=/root/site:$PWD python scripts/bench_trees.py --device cuda \
        --target gguf:/root/stage/smollm2.gguf --out $OUT  # the GPU machine (~2 min)

Scores: D=16 per-depth log-softmax rows over V=49152 (SmolLM2's vocabulary) of Zipf-shaped logits
(logit of rank r = -a_d * log(1 + r) + N(0, 0.5^2), ranks a random permutation per depth) with a_d
falling linearly from 2.0 at depth 1 to 1.2 at depth 16: the top-1 probability falls with depth as a
drafter's confidence does (seed 0: about 0.5 at depths 1-6, 0.13-0.37 at depths 10-16; printed first). A build is timed from those [D, V] log-probs (the ranked
top-k extraction is part of it) to the finished DraftTree. The verify pass is TargetModel.forward of
1 + budget tree tokens (the ddtree tree of that budget, its ancestor mask) after a context of 512
tokens, as the engine runs it; the ancestor mask is built outside the verify timing and reported on
its own row. Times are medians of repeats after warm-up; on CUDA every timed call is bracketed by
torch.cuda.synchronize(). Prints the table last; writes bench_trees.json and bench_trees.md to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from specbench.trees import TREE_POLICIES, DraftTree
from specbench.trees.base import DepthScores
from specbench.trees.ranking import ranked_topk

POLICIES: list[tuple[str, str, dict]] = [  # (row label, registry name, args)
    ("chain", "chain", {}),
    ("static default-63", "static", {"tree": "default-63"}),
    ("ddtree (heap)", "ddtree", {}),
    ("ddtree-vec", "ddtree-vec", {}),
    ("accum-logp K=7", "accum-logp", {"width": 7}),
    ("fanout-cap top2gap b=2", "fanout-cap", {"width": 7, "beta": 2.0}),
    ("eagle2 k=10 depth 8", "eagle2", {"top_k": 10, "max_depth": 8}),
]


def peaked_scores(depth: int, vocab: int, seed: int, device: torch.device) -> DepthScores:
    """Zipf-shaped per-depth log-probs whose top-1 probability falls with depth (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    rank_logit = -torch.log1p(torch.arange(vocab, dtype=torch.float32))  # [V]
    rows = []
    for d in range(depth):
        a = 2.0 - 0.8 * d / max(1, depth - 1)
        logits = a * rank_logit + 0.5 * torch.randn(vocab, generator=g)
        rows.append(logits[torch.randperm(vocab, generator=g)])
    return DepthScores(anchor=1, logp=torch.log_softmax(torch.stack(rows), dim=-1).to(device))


def median_time(fn: Callable[[], object], repeats: int, sync: Callable[[], None], warmup: int = 2) -> float:
    """Median wall seconds of fn() over `repeats` calls after `warmup` calls, synchronised."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def graphed_vec_times(scores: DepthScores, budgets: list[int], repeats: int,
                      sync: Callable[[], None]) -> dict[int, float | None]:
    """ddtree-vec captured in one CUDA graph per budget (its shapes depend only on B, D, V and it never
    syncs): replay time, after checking the replayed tree equals the eager one. None where capture fails
    (the error is printed)."""
    policy = TREE_POLICIES.build("ddtree-vec")
    static = DepthScores(scores.anchor, scores.logp.clone())
    out: dict[int, float | None] = {}
    for budget in budgets:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    policy.build(static, budget)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                tree = policy.build(static, budget)
            graph.replay()
            eager = policy.build(static, budget)
            fields = ("tokens", "parents", "depth", "scores")
            if not all(torch.equal(getattr(tree, f), getattr(eager, f)) for f in fields):
                raise RuntimeError("the replayed tree differs from the eager one")
            out[budget] = median_time(graph.replay, repeats, sync)
        except RuntimeError as exc:
            print(f"ddtree-vec CUDA graph, B={budget}: capture failed: {exc}", flush=True)
            out[budget] = None
    return out


def verify_times(args: argparse.Namespace, trees: dict[int, DraftTree], sync: Callable[[], None]) -> dict[int, float]:
    """Median seconds of one target forward over each tree after a context of args.context tokens."""
    from specbench.models.target import load_target

    target = load_target(args.target, device=args.device, dtype=args.dtype)
    vocab = target.config.vocab_size
    g = torch.Generator().manual_seed(args.seed)
    context = torch.randint(0, vocab, (1, args.context), generator=g).to(target.device)
    cache = target.new_cache(args.context + max(trees) + 1)
    target.forward(context, torch.arange(args.context, device=target.device)[None], cache, None,
                   logits_rows="last", kv_len=args.context)
    cache.advance(args.context)
    out = {}
    for budget, tree in trees.items():
        mask = tree.ancestor_mask[None]
        tokens = tree.tokens[None].remainder(vocab)
        positions = (args.context + tree.depth)[None]
        kv_len = args.context + tree.num_nodes

        def run() -> None:  # appends at slots [context, context + N) every time: the cache does not advance
            target.forward(tokens, positions, cache, mask, kv_len=kv_len)

        repeats = args.verify_repeats if budget < 1024 or args.device == "cuda" else max(3, args.verify_repeats // 2)
        out[budget] = median_time(run, repeats, sync, warmup=1)
        print(f"verify B={budget}: {out[budget] * 1e3:.2f} ms", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--target", default=None, help="target name for the verify pass (default: specbench's default)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=15, help="timed builds per (policy, budget)")
    parser.add_argument("--verify-repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-verify", action="store_true", help="time the builders only")
    parser.add_argument("--out", default=os.environ.get("OUT", "results/bench_trees"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    scores = peaked_scores(args.depth, args.vocab, args.seed, device)
    top1 = scores.logp.max(dim=-1).values.exp().tolist()
    print(f"scores: D={args.depth} V={args.vocab}; top-1 prob by depth: {', '.join(f'{p:.2f}' for p in top1)}")

    build: dict[str, dict[int, float]] = {}
    trees: dict[int, DraftTree] = {}
    for label, name, kwargs in POLICIES:
        policy = TREE_POLICIES.build(name, **kwargs)
        build[label] = {}
        for budget in args.budgets:
            tree = policy.build(scores, budget).validate()
            if name == "ddtree":
                trees[budget] = tree
            build[label][budget] = median_time(lambda: policy.build(scores, budget), args.repeats, sync)
        print(f"{label}: " + ", ".join(f"B={b} {t * 1e3:.3f} ms" for b, t in build[label].items()), flush=True)
    heap, vec = TREE_POLICIES.build("ddtree"), TREE_POLICIES.build("ddtree-vec")
    for budget in args.budgets:  # the vectorised builder must return the heap's tree exactly
        a, b = heap.build(scores, budget), vec.build(scores, budget)
        assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("tokens", "parents", "depth", "scores")), budget
    extra = {
        "ranked top-k [D, min(B, V)] alone": {
            b: median_time(lambda: ranked_topk(scores.logp, min(b, args.vocab)), args.repeats, sync)
            for b in args.budgets},
        "ancestor mask of the ddtree tree": {
            b: median_time(lambda: DraftTree(trees[b].tokens, trees[b].parents, trees[b].depth).ancestor_mask,
                           args.repeats, sync) for b in args.budgets},
    }
    if device.type == "cuda":
        extra["ddtree-vec in a CUDA graph (replay)"] = graphed_vec_times(scores, args.budgets, args.repeats, sync)
    verify = {} if args.no_verify else verify_times(args, trees, sync)

    lines = [f"Tree build per round vs one verify pass ({args.device}, "
             f"{torch.get_num_threads() if device.type == 'cpu' else torch.cuda.get_device_name(device)}"
             f"{' threads' if device.type == 'cpu' else ''}; D={args.depth}, V={args.vocab}, context {args.context}; "
             f"medians, ms; in brackets: % of the verify pass)", ""]
    header = "| policy | " + " | ".join(f"B={b}" for b in args.budgets) + " |"
    lines += [header, "|" + "---|" * (len(args.budgets) + 1)]
    for label, row in list(build.items()) + list(extra.items()):
        cells = []
        for b in args.budgets:
            if row.get(b) is None:
                cells.append("failed")
                continue
            pct = f" ({100 * row[b] / verify[b]:.2f}%)" if verify else ""
            cells.append(f"{row[b] * 1e3:.3f}{pct}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if verify:
        cells = " | ".join(f"{verify[b] * 1e3:.1f}" for b in args.budgets)
        lines.append(f"| verify pass ({args.dtype}, 1+B tokens) | {cells} |")
    table = "\n".join(lines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_trees.md").write_text(table + "\n")
    (out / "bench_trees.json").write_text(json.dumps({
        "args": vars(args), "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "top1_by_depth": top1, "build_s": build, "extra_s": extra,
        "verify_s": verify}, indent=1))
    print()
    print(table)


if __name__ == "__main__":
    main()
