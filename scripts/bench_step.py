"""The target's graphed decode step and tree-verify pass on the GPU, against the bandwidth bound of the
same run, for each kernel configuration (issue 13's AR baseline).

    python scripts/bench_step.py --shapes smollm2-135m-shape,qwen3-8b-shape --out results.json

For each shape (random weights, bf16): the KV cache is filled to the context with random K/V, then the
forward of 1 token (an AR step) and of a 65-node tree (budget 64) is captured in a CUDA graph and
replayed; time = median over replays (CUDA events, after warm-up), each replay synchronized (latency, what a
round with one host read per round pays), and, beside it, per replay of ten issued back to back ("b2b": the host's
graph launch hidden behind the replay before it). On the H200 the synchronized step varied by up to 0.3 ms between
runs of the same graph (0.80 vs 1.04-1.08 ms for SmolLM2's gemm-level AR step, 2026-12-03): `--trace` put that time
in one gap between the eager input copies and the graph's first kernel, a gap that grows with the graph's
nodes. Bound = (weight bytes + K/V bytes the
step reads: every weight but an untied input embedding, of which a step gathers one row) / the device-to-device
copy bandwidth measured in the same run (bytes read + written).
Variants: the layer ops' fusion level (`Transformer.set_fused`: "gemm" = add+RMSNorm and SiLU*up fused
into the following matrix product where timed faster per shape, "elementwise" = today's element-wise
Triton kernels + cuBLAS, "reference" = PyTorch ops; "stats" = gemm without the RMSNorm kernels at verify's rows,
`kernels/norm_stats.py`, asked for by name) x the Triton tree-attention kernel or SDPA (or `triton-merge` /
`triton-split-merge`: where the prefix splits merge, forced), all timed in the same run. For "gemm" the per-shape choice (fused kernel vs unfused, CUDA-graph timed at
the eager warm-up that precedes each capture) is printed. `--profile` prints the kernel tables of the
elementwise and gemm variants' eager AR step and verify(65) pass (triton attention) per shape; `--trace` profiles
replays of the captured AR graph itself and prints its timeline (kernels per replay, the kernels' busy time, the
span, the gaps between kernels and which kernels they precede: what a graph costs beyond its kernels). The cache
has the engine's slots (2,048 + two rounds of 65): the graphed forward reads it whole, and its size is
what the attention kernel's split is planned for. A variant that fails is
reported and skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch

from specbench.models import load_target
from specbench.models.decoder import is_triton_backend
from specbench.models.graphs import GraphedForward
from specbench.trees.base import DraftTree

CONTEXT = {"smollm2-135m-shape": 512, "qwen3-8b-shape": 2048}
VARIANTS = (("elementwise", "triton"), ("gemm", "triton"), ("reference", "triton"), ("elementwise", "sdpa"),
            ("gemm", "sdpa"), ("reference", "sdpa"), ("gemm", "triton-merge"), ("gemm", "triton-split-merge"),
            ("stats", "triton"), ("gemm", "triton-decode"))
DEFAULT_VARIANTS = VARIANTS[:6]  # the triton-merge twins, the stats level and the decode kernel's AR step: by name


def copy_bandwidth(nbytes: int = 4 << 30, repeats: int = 20) -> float:
    """Bytes per second moved by a device-to-device copy (read + write)."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return 2 * nbytes / statistics.median(times)


def random_tree(n: int, seed: int) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(max(0, i - 6), i, (1,), generator=g)) for i in range(1, n)]
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    tokens = torch.randint(0, 1000, (n,), generator=g).tolist()
    return DraftTree.from_lists(tokens, parents, depth, device="cuda")


def time_graph(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)  # ms


def time_back_to_back(fn, repeats: int, batch: int = 10) -> float:
    """ms per call of `fn` issued `batch` at a time with no sync between them (median over batches): the host's
    launch of each replay overlaps the replay before it, so a slow graph launch (whose cost grows with the graph's
    nodes) does not show, as it does in `time_graph`'s synchronized steps."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(max(1, repeats // batch)):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(batch):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / batch)
    return statistics.median(times)


def graph_timeline(kernels: list[tuple[str, int, int]], replays: int, top: int = 8) -> dict:
    """Where a graph replay's time goes, from the device activities (kernels, memcpy, memset) of `replays`
    back-to-back-synchronized replays (name, start ns, duration ns): per replay the node count, busy time (their
    sum), span (first start to last end) and gaps (span - busy); per name its calls, mean duration and mean gap
    before it (within a replay), the `top` by total gap first; and the first replay's largest gaps with the
    nodes on either side. Times in microseconds."""
    kernels = sorted(kernels, key=lambda k: k[1])
    if replays < 1 or not kernels or len(kernels) % replays:
        raise ValueError(f"graph_timeline: {len(kernels)} kernels do not split into {replays} equal replays")
    per = len(kernels) // replays
    spans, busy, stats, big = [], [], {}, []
    for r in range(replays):
        run = kernels[r * per:(r + 1) * per]
        spans.append((run[-1][1] + run[-1][2] - run[0][1]) / 1e3)
        busy.append(sum(k[2] for k in run) / 1e3)
        for i, (name, start, dur) in enumerate(run):
            gap = 0.0 if i == 0 else max(0.0, (start - run[i - 1][1] - run[i - 1][2]) / 1e3)
            if i and r == 0:
                big.append((gap, run[i - 1][0][:60], name[:60], i))
            s = stats.setdefault(name[:60], [0, 0.0, 0.0])
            s[0] += 1
            s[1] += dur / 1e3
            s[2] += gap
    by_gap = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return {"kernels_per_replay": per, "span_us": statistics.median(spans), "busy_us": statistics.median(busy),
            "gap_us": statistics.median(s - b for s, b in zip(spans, busy)),
            "by_gap": [{"kernel": n, "calls_per_replay": c / replays, "mean_us": d / c, "mean_gap_before_us": g / c}
                       for n, (c, d, g) in by_gap],
            "largest_gaps": [{"gap_us": g, "after": a, "before": b, "index": i}  # in the first replay
                             for g, a, b, i in sorted(big, reverse=True)[:top // 2]]}


def trace_graph(fn, replays: int = 5) -> dict:
    """`graph_timeline` of `replays` replays of `fn` (a graph replay), from the profiler's device kernels."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            fn()
            torch.cuda.synchronize()
    kernels = [(e.name(), e.start_ns(), e.duration_ns()) for e in prof.profiler.kineto_results.events()
               if e.device_type() == torch.autograd.DeviceType.CUDA]  # kernels, memcpy and memset nodes alike
    return graph_timeline(kernels, replays)


def print_timeline(label: str, t: dict) -> None:
    print(f"-- {label}: graph replay timeline: {t['kernels_per_replay']} nodes, span {t['span_us']:.1f} us, "
          f"kernels busy {t['busy_us']:.1f} us, gaps {t['gap_us']:.1f} us")
    for k in t["by_gap"]:
        print(f"     {k['kernel']:<60} {k['calls_per_replay']:>5.0f} calls  {k['mean_us']:6.2f} us each  "
              f"{k['mean_gap_before_us']:5.2f} us gap before")
    for g in t["largest_gaps"]:
        print(f"     gap {g['gap_us']:7.1f} us at node {g['index']}: after {g['after']} / before {g['before']}")


def bench_variant(model, cache, ops: str, attention: str, context: int, tree: DraftTree, repeats: int,
                  profile: bool, trace: bool = False) -> tuple[dict, torch.Tensor]:
    """One variant's AR and verify(65) graph times (and its AR step's logits [V], to compare variants)."""
    model.set_fused(ops)
    model.set_attention(attention)
    graphed = GraphedForward(model, cache, buckets=[1, 65])  # each bucket warmed up eagerly, then captured
    row: dict = {"ops": ops, "attention": attention}
    logits = None
    for label, n in (("ar", 1), ("verify65", 65)):
        t = tree if n == 65 else DraftTree.root_only(7, "cuda")

        def step(t=t):  # the forward never moves the lengths: every replay reads the same context
            return graphed(t.tokens[None], (context + t.depth)[None], t.ancestor_mask[None])

        cache.lengths.fill_(context)
        row[f"{label}_ms"] = time_graph(step, repeats)
        row[f"{label}_b2b_ms"] = time_back_to_back(step, repeats)
        if n == 1:
            logits = step().logits[0, 0].float().clone()
        if trace:
            try:
                row[f"{label}_timeline"] = trace_graph(step)
                print_timeline(f"{ops}/{attention} {label}", row[f"{label}_timeline"])
            except (ValueError, RuntimeError, AttributeError) as exc:  # a profiler that drops graph kernels
                print(f"-- {ops}/{attention} {label}: no graph timeline ({type(exc).__name__}: {exc})")
    choices = [c for f in dataclasses.fields(model.ops) if hasattr(op := getattr(model.ops, f.name), "choices")
               for c in op.choices()]  # every per-shape op of the level
    if choices:
        row["gemm_choices"] = choices
    if profile and is_triton_backend(attention) and ops != "reference":
        from torch.profiler import ProfilerActivity, profile as torch_profile

        for label, t in (("AR step", DraftTree.root_only(7, "cuda")), ("verify(65)", tree)):
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:  # the eager forward: the graph's kernels
                for _ in range(10):
                    model(t.tokens[None], (context + t.depth)[None], cache, t.ancestor_mask[None])
                torch.cuda.synchronize()
            print(f"-- {ops} {label}: kernels of 10 eager forwards")
            print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=70))
    return row, logits  # the graphs go with `graphed`


def bench_shape(shape: str, bandwidth: float, repeats: int, profile: bool,
                variants: tuple[tuple[str, str], ...] = DEFAULT_VARIANTS, trace: bool = False, rounds: int = 1) -> list[dict]:
    target = load_target(f"random:{shape}", device="cuda", dtype="bfloat16")
    model, cfg = target.model, target.config
    context = CONTEXT.get(shape, 1024)
    cache = target.new_cache(max(2048, context) + 2 * 65)  # the engine's cache: what sizes the attention split
    g = torch.Generator(device="cuda").manual_seed(1)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied matrix once
    # What a step reads: every weight but an untied input embedding, of which it gathers one row per token
    # (Qwen3-8B shapes: 1.24 GB that the figures of 2026-12-03 and before counted in the bound)
    embed = model.embed.weight
    read_bytes = weight_bytes - (0 if cfg.tie_word_embeddings else (embed.shape[0] - 1) * embed.shape[1] * embed.element_size())
    kv_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * context * cfg.head_dim * cache.k.element_size()
    bound_ms = 1e3 * (read_bytes + kv_bytes) / bandwidth
    bound_all_weights_ms = 1e3 * (weight_bytes + kv_bytes) / bandwidth
    tree = random_tree(65, 0)
    rows, first_logits = [], None
    for rnd, (ops, attention) in ((r, v) for r in range(rounds) for v in variants):
        try:  # one variant failing (a kernel that does not compile here) does not lose the others' figures
            row, logits = bench_variant(model, cache, ops, attention, context, tree, repeats, profile and rnd == 0,
                                        trace)
            row["round"] = rnd
        except Exception as exc:  # noqa: BLE001
            print(f"{shape:>20} {ops:>11} {attention:>6}: FAILED {type(exc).__name__}: {exc}", flush=True)
            rows.append({"shape": shape, "ops": ops, "attention": attention, "error": f"{type(exc).__name__}: {exc}"})
            torch.cuda.synchronize()
            continue
        if first_logits is None:
            first_logits = logits
        row.update(shape=shape, context=context, weight_MB=weight_bytes / 1e6, weight_read_MB=read_bytes / 1e6,
                   kv_MB=kv_bytes / 1e6, bound_ms=bound_ms, bound_all_weights_ms=bound_all_weights_ms,
                   pct_of_bound=100 * bound_ms / row["ar_ms"], pct_of_bound_b2b=100 * bound_ms / row["ar_b2b_ms"],
                   ar_tok_s=1e3 / row["ar_ms"],
                   verify_over_ar=row["verify65_ms"] / row["ar_ms"],
                   ar_logits_rel_err=float((logits - first_logits).norm() / first_logits.norm()))
        rows.append(row)
        print(f"{shape:>20} {ops:>11} {attention:>6} #{rnd}: AR {row['ar_ms']:.3f} ms ({row['ar_tok_s']:.0f} tok/s, "
              f"{row['pct_of_bound']:.0f}% of the {bound_ms:.3f} ms bound; back to back {row['ar_b2b_ms']:.3f} ms), verify(65) "
              f"{row['verify65_ms']:.3f} ms (back to back {row['verify65_b2b_ms']:.3f}) "
              f"= {row['verify_over_ar']:.2f}x AR; AR logits vs {variants[0][0]}/{variants[0][1]}: rel err "
              f"{row['ar_logits_rel_err']:.1e}", flush=True)
        for c in row.get("gemm_choices", []):
            print(f"{'':>24}{c['op']:>20} {' '.join(str(tuple(t)) for t in c['shapes'])}: fused "
                  f"{1e3 * c['fused_ms']:.1f} us, unfused {1e3 * c['fallback_ms']:.1f} us -> {c['uses']}")
    model.set_fused(True)
    del target, cache
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="smollm2-135m-shape,qwen3-8b-shape")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--trace", action="store_true", help="the captured AR/verify graphs' replay timelines (gaps)")
    p.add_argument("--rounds", type=int, default=1,
                   help="time every variant this many times in turn (A B A B ...): an order or warm-up effect shows")
    p.add_argument("--variants", default=",".join(f"{o}/{a}" for o, a in DEFAULT_VARIANTS),
                   help="LEVEL/ATTENTION pairs to time, the first is the logits reference (default: all)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    variants = tuple(tuple(v.split("/")) for v in args.variants.split(","))
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        p.error(f"--variants: unknown {bad}; choose from {', '.join(f'{o}/{a}' for o, a in VARIANTS)}")
    torch.set_grad_enabled(False)
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: device-to-device copy {bw / 1e12:.2f} TB/s (read + write)")
    rows = []
    for shape in args.shapes.split(","):
        rows += bench_shape(shape, bw, args.repeats, args.profile, variants, args.trace, args.rounds)
    print("\n| shape | level | attention | round | AR ms | tok/s | % of bound | verify(65) ms | verify/AR |\n"
          "|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['shape']} | {r['ops']} | {r['attention']} | | failed: {r['error'][:60]} | | | | |")
            continue
        print(f"| {r['shape']} | {r['ops']} | {r['attention']} | {r['round']} | {r['ar_ms']:.3f} | {r['ar_tok_s']:.0f} | "
              f"{r['pct_of_bound']:.0f} | {r['verify65_ms']:.3f} | {r['verify_over_ar']:.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_bandwidth_Bps": bw, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
