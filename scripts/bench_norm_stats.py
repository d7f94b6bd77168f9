"""A layer's chain between two attention kernels, as the gemm level runs it at several rows today, against the same
chain with RMSNorm's statistics taken from the products that write the stream (`specbench.kernels.norm_stats`).

    python scripts/bench_norm_stats.py --out norm_stats.json     # CUDA, bf16; under a minute

The chain is wo -> add+RMSNorm -> gate/up + SiLU*up -> down -> add+RMSNorm -> wqkv -> q/k norm, RoPE, K/V write:

    today   cuBLAS wo; `add_rmsnorm_mlp` (RMSNorm kernel, gate/up kernel, cuBLAS down); `add_rmsnorm_qkv_rope_then_split`
            (RMSNorm kernel, cuBLAS wqkv, `qkv_rope`): 7 kernels
    stats   `linear_residual` (wo); `gate_up_silu_scaled`; `linear_residual` (down); cuBLAS wqkv with the norm folded;
            `qkv_rope(row_sumsq=)`: 5 kernels

For SmolLM2-135M and Qwen3-8B shapes (random weights) at 17 and 65 rows (verify at budgets 16 and 64), each chain is
captured in one CUDA graph over as many layers' weights as the model has (so L2 holds what it does in a forward),
timed by replays issued back to back (CUDA events, the median of repeats), per layer, A B A B. Both chains are first
compared (q, the K/V written, the stream) on the same inputs. `chains_agree` runs that comparison on any device
(the tests run it under TRITON_INTERPRET=1 on tiny shapes).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from specbench.kernels import norm_linear as nl, qkv_rope_linear as ql
from specbench.kernels.fused import qkv_rope
from specbench.kernels.norm_stats import fold_norm, gate_up_silu_scaled, linear_residual

SHAPES = {  # hidden, intermediate, heads, KV heads, head dim, q/k norm, layers
    "smollm2-135m": (576, 1536, 9, 3, 64, False, 30),
    "qwen3-8b": (4096, 12288, 32, 8, 128, True, 36),
}
ROWS = (17, 65)
EPS = 1e-5
SLOTS = 2048 + 2 * 65


def layer_weights(shape: tuple, copies: int, device: str, dtype: torch.dtype, seed: int = 0) -> list[dict]:
    """`copies` layers of random weights, each with its folded twins for the stats chain."""
    d, inter, h, hkv, hd, qk, _ = shape
    g = torch.Generator().manual_seed(seed)

    def w(*s: int) -> torch.Tensor:
        return (torch.randn(*s, generator=g) * s[-1] ** -0.5).to(device, dtype)

    def norm(n: int) -> torch.Tensor:
        return (1 + 0.1 * torch.randn(n, generator=g)).to(device, dtype)

    layers = []
    for _ in range(copies):
        lw = {"wo": w(d, h * hd), "w_gu": w(2 * inter, d), "w_down": w(d, inter), "wqkv": w((h + 2 * hkv) * hd, d),
              "g_mlp": norm(d), "g_attn": norm(d), "qn": norm(hd) if qk else None, "kn": norm(hd) if qk else None}
        lw["w_gu_folded"] = fold_norm(lw["g_mlp"], lw["w_gu"])
        lw["wqkv_folded"] = fold_norm(lw["g_attn"], lw["wqkv"])
        layers.append(lw)
    return layers


def chain_today(o: torch.Tensor, x: torch.Tensor, lw: dict, shape: tuple, rope: tuple, caches: tuple, slots):
    """(q, stream): the gemm level's ops at several rows."""
    _, _, h, hkv, hd, _, _ = shape
    a = F.linear(o, lw["wo"])
    y, x2 = nl.add_rmsnorm_mlp(x, a, lw["g_mlp"], EPS, lw["w_gu"], lw["w_down"])
    q, x3 = ql.add_rmsnorm_qkv_rope_then_split(x2, y, lw["g_attn"], EPS, lw["wqkv"], None, *rope, h, hkv, hd, *caches,
                                               slots, lw["qn"], lw["kn"], 1e-6)
    return q, x3  # the stream x2 + y, as the next layer's norm would add it


def chain_stats(o: torch.Tensor, x: torch.Tensor, lw: dict, shape: tuple, rope: tuple, caches: tuple, slots):
    """(q, stream): the norms' statistics from the products that write the stream."""
    d, _, h, hkv, hd, _, _ = shape
    x2, ss2 = linear_residual(o, lw["wo"], x)
    act = gate_up_silu_scaled(x2, ss2, EPS, lw["w_gu_folded"])
    x3, ss3 = linear_residual(act, lw["w_down"], x2)
    q = qkv_rope(F.linear(x3, lw["wqkv_folded"]), *rope, h, hkv, hd, *caches, slots, lw["qn"], lw["kn"], 1e-6,
                 row_sumsq=ss3, stream_dim=d, stream_eps=EPS)
    return q, x3


def inputs(shape: tuple, rows: int, device: str, dtype: torch.dtype, slots: int = SLOTS, seed: int = 1):
    d, _, h, hkv, hd, _, _ = shape
    g = torch.Generator().manual_seed(seed)
    o = torch.randn(1, rows, h * hd, generator=g).to(device, dtype)
    x = (3 * torch.randn(1, rows, d, generator=g)).to(device, dtype)
    pos = (torch.arange(rows).float() + 100).reshape(1, rows, 1, 1)
    freq = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    emb = torch.cat([pos * freq, pos * freq], dim=-1)
    rope = (emb.cos().to(device, dtype), emb.sin().to(device, dtype))
    sl = (torch.arange(rows) + min(200, slots - rows)).reshape(1, rows).to(device)  # cache slots to write
    return o, x, rope, sl


def fresh_caches(shape: tuple, device: str, dtype: torch.dtype, slots: int = SLOTS) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, _, hkv, hd, _, _ = shape
    return (torch.zeros(1, hkv, slots, hd, device=device, dtype=dtype),
            torch.zeros(1, hkv, slots, hd, device=device, dtype=dtype))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def chains_agree(shape: tuple, rows: int, device: str, dtype: torch.dtype, slots: int = SLOTS) -> dict[str, float]:
    """Relative errors of the stats chain against today's on the same inputs: q, K and V written, the stream."""
    (lw,) = layer_weights(shape, 1, device, dtype)
    o, x, rope, sl = inputs(shape, rows, device, dtype, slots)
    ca, cb = fresh_caches(shape, device, dtype, slots), fresh_caches(shape, device, dtype, slots)
    qa, xa = chain_today(o, x, lw, shape, rope, ca, sl)
    qb, xb = chain_stats(o, x, lw, shape, rope, cb, sl)
    return {"q": rel(qb, qa), "k": rel(cb[0], ca[0]), "v": rel(cb[1], ca[1]), "stream": rel(xb, xa)}


def time_chain(chain, shape: tuple, rows: int, device: str, dtype: torch.dtype, repeats: int, b2b: int = 10) -> float:
    """us per layer: one graph over every layer's weights, replayed `b2b` times back to back, median of repeats."""
    layers = layer_weights(shape, shape[-1], device, dtype)
    o, x, rope, sl = inputs(shape, rows, device, dtype)
    caches = fresh_caches(shape, device, dtype)
    for lw in layers:  # JIT and autotune outside the capture
        chain(o, x, lw, shape, rope, caches, sl)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for lw in layers:
            chain(o, x, lw, shape, rope, caches, sl)
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        for _ in range(b2b):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (b2b * len(layers)))
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="JSON of the rows")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2, help="time the two chains this many times in turn (A B A B)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        p.error("needs CUDA (the correctness half runs on the CPU in tests/kernels/test_bench_norm_stats.py)")
    dtype, rows_out = torch.bfloat16, []
    for name, shape in SHAPES.items():
        for rows in ROWS:
            err = chains_agree(shape, rows, "cuda", dtype)
            row = {"shape": name, "rows": rows, "rel_err": err, "today_us": [], "stats_us": []}
            for _ in range(args.rounds):
                row["today_us"].append(time_chain(chain_today, shape, rows, "cuda", dtype, args.repeats))
                row["stats_us"].append(time_chain(chain_stats, shape, rows, "cuda", dtype, args.repeats))
            today, stats = statistics.median(row["today_us"]), statistics.median(row["stats_us"])
            print(f"{name:>13} M={rows:>3}: today {today:6.2f} us/layer, stats {stats:6.2f} us/layer "
                  f"({today - stats:+.2f}); rounds {row['today_us']} / {row['stats_us']}; rel err "
                  + ", ".join(f"{k} {v:.1e}" for k, v in err.items()), flush=True)
            rows_out.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
