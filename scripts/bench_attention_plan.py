"""Tree attention's launch plan where the graphed verify forward runs it: config by config, against the plan.

    python scripts/bench_attention_plan.py --out attention_plan.json      # CUDA, bf16; about a minute

The graphed forward reads the whole static cache (S = 2,048 + room for two rounds of 65 slots, what the
engine allocates), so `plan_attention` sizes the split from S, not from the context: one config serves
every context a request passes through. This times, for each head shape (SmolLM2-135M 9/3/64, Qwen3-8B
32/8/128) and node count N (1: an AR step, 17 and 65: verify at budgets 16 and 64), a grid of configs
(rows per program, keys per tile, warps, pipeline depth) x split counts, and the plan's twin with the
other merge (in the attention kernel or a kernel of its own; `--plan-only`: those two), at several contexts C on the
same cache, each over as many distinct layers' K/V buffers as the model has (so L2 holds no more than
it does in a forward), captured in one CUDA graph and timed by replay (median, CUDA events). Every
config is first checked against the float64 reference on fresh random inputs. Prints, per shape and N,
the plan's config and time, and the configs with the lowest mean time over the contexts.
`check_configs` runs the correctness half under TRITON_INTERPRET=1 (the tests do).

`--decode`: at N = 1, the decode kernel (`kernels/decode_attention.py`): its plan and a grid of its configs
(keys per tile, warps, pipeline depth, splits), beside the general kernel's plan, timed the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from specbench.kernels.decode_attention import DecodeConfig, decode_attention, plan_decode
from specbench.kernels.masks import pack_tree_mask
from specbench.kernels.reference import tree_attention_reference
from specbench.kernels.tree_attention import AttentionConfig, plan_attention, tree_attention

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_variants import graph_us_per_call  # noqa: E402

SHAPES = {"smollm2": (9, 3, 64, 30), "qwen3-8b": (32, 8, 128, 36)}  # heads, KV heads, head dim, layers
CONTEXTS = {"smollm2": (128, 384, 768, 1536), "qwen3-8b": (512, 2048)}
SLOTS = 2048 + 2 * 65
NODES = (1, 17, 65)
TILES = [(16, 64, 4, 3), (32, 64, 4, 3), (64, 32, 4, 3), (64, 64, 4, 3), (64, 128, 4, 2), (64, 64, 8, 3),
         (128, 32, 8, 3), (128, 64, 8, 3), (128, 64, 4, 2)]  # (block_m, block_s, warps, stages)
SPLITS = (1, 2, 4, 8, 16, 32)
DECODE_TILES = [(32, 4, 3), (64, 4, 3), (64, 8, 3), (128, 4, 2)]  # keys per tile, warps, stages
DECODE_SPLITS = (16, 32, 64)


def grid(rows: int) -> list[AttentionConfig]:
    """The configs whose row tile is at most the rows (group x N) rounded up to a power of two."""
    cap = max(16, 1 << (rows - 1).bit_length())
    return [AttentionConfig(bm, bs, w, st, sp) for (bm, bs, w, st), sp in itertools.product(TILES, SPLITS) if bm <= cap]


def random_tree_bits(n: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """[1, N, W] packed ancestor mask of a random tree (parents at most 6 back)."""
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        mask[i] |= mask[int(torch.randint(max(0, i - 6), i, (1,), generator=gen))]
    return pack_tree_mask(mask[None].to(device))


def inputs(heads: int, kv_heads: int, dim: int, n: int, slots: int, copies: int, device: str, dtype: torch.dtype,
           seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(copies, 1, heads, n, dim, generator=gen).to(device, dtype)
    k = torch.randn(copies, 1, kv_heads, slots, dim, generator=gen).to(device, dtype)
    v = torch.randn(copies, 1, kv_heads, slots, dim, generator=gen).to(device, dtype)
    return q, k, v, random_tree_bits(n, gen, device)


def check_configs(heads: int, kv_heads: int, dim: int, n: int, context: int, slots: int, device: str,
                  dtype: torch.dtype, configs: list) -> dict:
    """Relative error of each config's output against the float64 reference (one layer's inputs)."""
    q, k, v, bits = inputs(heads, kv_heads, dim, n, slots, 1, device, dtype, seed=context + n)
    lengths = torch.tensor([context], device=device)
    ref = tree_attention_reference(q[0], k[0], v[0], lengths, bits, dim ** -0.5)
    errors = {}
    counters = torch.zeros(4096, dtype=torch.int32, device=device)
    for cfg in configs:
        out = torch.full_like(q[0], float("nan"))  # poisoned: every element must be written
        attend(q[0], k[0], v[0], lengths, bits, dim ** -0.5, cfg, out, counters)
        errors[cfg] = float((out.double() - ref).norm() / ref.norm())
    return errors


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, bits: torch.Tensor, scale: float,
           cfg: AttentionConfig | DecodeConfig, out: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One layer's attention under `cfg`: the decode kernel for a DecodeConfig, else tree_attention."""
    if isinstance(cfg, DecodeConfig):
        return decode_attention(q, k, v, lengths, bits, scale, context_hint=k.shape[2] - 1, config=cfg, out=out,
                                split_counters=counters)
    return tree_attention(q, k, v, lengths, bits, scale, kv_len=k.shape[2], config=cfg, out=out,
                          split_counters=counters)


def time_layers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bits: torch.Tensor, lengths: torch.Tensor,
                cfg: AttentionConfig | DecodeConfig, reps: int = 15) -> float:
    """Microseconds per layer: one call per layer's buffers, captured in one CUDA graph, replays timed (median)."""
    out = torch.empty_like(q)
    scale = q.shape[-1] ** -0.5
    counters = torch.zeros(4096, dtype=torch.int32, device=q.device)  # the fused merge's tickets (KVCache's)

    def layers() -> None:
        for i in range(q.shape[0]):
            attend(q[i], k[i], v[i], lengths, bits, scale, cfg, out[i], counters)

    return graph_us_per_call(layers, q.shape[0], reps)


def check_and_time(shape: str, n: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bits: torch.Tensor,
                   configs: list) -> tuple[set, dict, dict, list]:
    """The configs that miss the reference, each other config's µs a layer by context, their means, ranked."""
    heads, kv_heads, dim, _ = SHAPES[shape]
    contexts = CONTEXTS[shape]
    bad = {c for c, e in check_configs(heads, kv_heads, dim, n, contexts[-1], SLOTS, "cuda", torch.bfloat16,
                                       configs).items() if not e < 2e-2}
    times: dict = {}
    for cfg in configs:
        if cfg in bad:
            continue
        try:
            times[cfg] = [time_layers(q, k, v, bits, torch.tensor([c], device="cuda"), cfg) for c in contexts]
        except Exception as exc:  # noqa: BLE001 - out of resources: that config cannot run here
            print(f"{shape} N={n} {cfg}: {type(exc).__name__}", flush=True)
    mean = {c: statistics.mean(t) for c, t in times.items()}
    return bad, times, mean, sorted(mean, key=mean.get)


def bench(shape: str, n: int, plan_only: bool = False) -> dict[str, Any]:
    heads, kv_heads, dim, layers = SHAPES[shape]
    contexts = CONTEXTS[shape]
    q, k, v, bits = inputs(heads, kv_heads, dim, n, SLOTS, layers, "cuda", torch.bfloat16)
    plan = plan_attention(1, kv_heads, heads // kv_heads, n, SLOTS - n, q.device)
    twin = dataclasses.replace(plan, fused_merge=not plan.fused_merge)  # the merge in the kernel vs its own
    configs = [plan, twin] + ([] if plan_only else [c for c in grid(heads // kv_heads * n) if c not in (plan, twin)])
    bad, times, mean, ranked = check_and_time(shape, n, q, k, v, bits, configs)
    row = {"shape": shape, "N": n, "contexts": contexts, "slots": SLOTS, "plan": dataclasses.asdict(plan),
           "plan_us": times.get(plan), "wrong_configs": [dataclasses.asdict(c) for c in bad],
           "best": [{"config": dataclasses.asdict(c), "us": times[c], "mean_us": mean[c]} for c in ranked[:8]]}
    plan_mean = mean.get(plan, float("nan"))
    row["twin"], row["twin_us"] = dataclasses.asdict(twin), times.get(twin)
    print(f"{shape:>8} N={n:>3}: fused_merge={twin.fused_merge} twin {mean.get(twin, float('nan')):6.2f} us (by C: "
          + " ".join(f"{t:.2f}" for t in times.get(twin, [])) + ")", flush=True)
    print(f"{shape:>8} N={n:>3}: plan {plan} {plan_mean:6.2f} us (by C: "
          + " ".join(f"{t:.2f}" for t in times.get(plan, [])) + ")", flush=True)
    for c in ranked[:4]:
        print(f"{'':>16} {c} {mean[c]:6.2f} us (" + " ".join(f"{t:.2f}" for t in times[c]) + ")", flush=True)
    return row


def bench_decode(shape: str) -> dict[str, Any]:
    """N = 1: the general kernel's plan against the decode kernel's plan and grid."""
    heads, kv_heads, dim, layers = SHAPES[shape]
    contexts = CONTEXTS[shape]
    q, k, v, _ = inputs(heads, kv_heads, dim, 1, SLOTS, layers, "cuda", torch.bfloat16)
    bits = pack_tree_mask(torch.ones(1, 1, 1, dtype=torch.bool, device="cuda"))
    general = plan_attention(1, kv_heads, heads // kv_heads, 1, SLOTS - 1, q.device)
    plan = plan_decode(1, kv_heads, SLOTS - 1, q.device)
    grid_ = [DecodeConfig(bs, w, st, sp) for (bs, w, st), sp in itertools.product(DECODE_TILES, DECODE_SPLITS)]
    configs = [general, plan] + [c for c in grid_ if c != plan]
    bad, times, mean, ranked = check_and_time(shape, 1, q, k, v, bits, configs)
    for name, c in (("general plan", general), ("decode plan", plan)):
        print(f"{shape:>8} N=  1 {name}: {c} {mean.get(c, float('nan')):6.2f} us (by C: "
              + " ".join(f"{t:.2f}" for t in times.get(c, [])) + ")", flush=True)
    for c in ranked[:5]:
        print(f"{'':>16} {c} {mean[c]:6.2f} us (" + " ".join(f"{t:.2f}" for t in times[c]) + ")", flush=True)
    return {"shape": shape, "N": 1, "decode": True, "contexts": contexts, "slots": SLOTS,
            "general_plan": dataclasses.asdict(general), "general_us": times.get(general),
            "plan": dataclasses.asdict(plan), "plan_us": times.get(plan),
            "wrong_configs": [dataclasses.asdict(c) for c in bad],
            "best": [{"config": dataclasses.asdict(c), "kind": type(c).__name__, "us": times[c], "mean_us": mean[c]}
                     for c in ranked[:8]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--nodes", default=",".join(map(str, NODES)))
    p.add_argument("--out", default=None, help="JSON of the rows")
    p.add_argument("--plan-only", action="store_true", help="only the plan and its twin of the other merge")
    p.add_argument("--decode", action="store_true", help="N = 1 only: the decode kernel's configs vs the general plan")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention_plan times CUDA kernels: run it on a GPU (the tests check it on the CPU)")
    if args.decode:
        rows = [bench_decode(shape) for shape in args.shapes.split(",")]
    else:
        rows = [bench(shape, int(n), args.plan_only) for shape in args.shapes.split(",") for n in args.nodes.split(",")]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
