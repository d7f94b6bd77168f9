"""The fused add+RMSNorm -> product tile kernel at tree-verify row counts, config by config (row tile
BLOCK_M included), against the unfused pair (the RMSNorm kernel + cuBLAS): whether a row-tile dimension
would let the fused path win where it loses today (SmolLM2's wqkv at 65 rows: 8.5 us fused against
4.8 us of cuBLAS + 1.6 us of RMSNorm, `docs/measurements/README.md`).

    python scripts/bench_norm_linear.py --out bench_norm_linear.json      # CUDA, bf16; about a minute

Shapes: the products after a norm in SmolLM2-135M and Qwen3-8B (wqkv, gate/up, LM head; K x N), at
17 and 65 rows (the verify passes of budgets 16 and 64), random inputs. Each config is first checked
against the unfused result (it must agree to bf16 rounding), then timed by CUDA-graph replay
(`triton.testing.do_bench_cudagraph`, median); the unfused pair likewise. Prints, per shape and row
count, the fastest config and the unfused time. Under TRITON_INTERPRET=1 (the CPU) `check_configs`
runs the correctness half on small shapes (the tests do).
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

import torch
import triton

from specbench.kernels import norm_linear as nl

# (name, K, N): the products that follow an RMSNorm
SHAPES = {
    "smollm2": [("wqkv", 576, 960), ("gate_up", 576, 3072), ("lm_head", 576, 49152)],
    "qwen3-8b": [("wqkv", 4096, 6144), ("gate_up", 4096, 24576), ("lm_head", 4096, 151936)],
}
ROWS = (17, 65)
BLOCK_MS = (16, 32, 64, 128)
TILES = [(16, 256, 4, 4), (32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 4), (64, 256, 8, 3), (128, 64, 4, 4),
         (128, 128, 8, 3), (64, 64, 4, 3)]  # (BLOCK_N, BLOCK_K, warps, stages)


def configs(m: int, k: int, n: int) -> list[tuple[int, int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) whose tiles do not exceed the padded shape."""
    return [(bm, bn, bk, w, s) for bm, (bn, bk, w, s) in itertools.product(BLOCK_MS, TILES)
            if bm <= max(16, triton.next_power_of_2(m)) and bn <= max(16, triton.next_power_of_2(n))
            and bk <= max(16, triton.next_power_of_2(k))]


def fused(x: torch.Tensor, delta: torch.Tensor, norm_w: torch.Tensor, w: torch.Tensor,
          cfg: tuple[int, int, int, int, int]) -> torch.Tensor:
    """The tile kernel at one explicit config (no autotuning): y [M, N] of rows x + delta [M, K]."""
    bm, bn, bk, warps, stages = cfg
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=w.dtype, device=x.device)
    resid = torch.empty_like(x)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    nl._add_rmsnorm_linear_kernel.fn[grid](
        x, delta, norm_w, w, w, y, resid, m, n, k, max(bm, triton.next_power_of_2(m)), 1e-5,
        x.stride(0), delta.stride(0), resid.stride(0), w.stride(0), y.stride(0),
        HAS_DELTA=True, HAS_BIAS=False, **nl._precision(w.dtype), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=warps, num_stages=stages)
    return y


def unfused(x: torch.Tensor, delta: torch.Tensor, norm_w: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return nl.add_rmsnorm_then_linear(x, delta, norm_w, 1e-5, w)[0]


def inputs(m: int, k: int, n: int, device: str, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x, delta = (torch.randn(m, k, generator=g).to(device, dtype) for _ in range(2))
    norm_w = (1 + 0.1 * torch.randn(k, generator=g)).to(device, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
    return x, delta, norm_w, w


def check_configs(m: int, k: int, n: int, device: str, dtype: torch.dtype,
                  cfgs: list[tuple[int, int, int, int, int]] | None = None) -> dict[tuple, float]:
    """Max abs difference of each config's output from the unfused pair's (bf16: within an output rounding)."""
    x, delta, norm_w, w = inputs(m, k, n, device, dtype)
    want = unfused(x, delta, norm_w, w).float()
    return {cfg: float((fused(x, delta, norm_w, w, cfg).float() - want).abs().max()) for cfg in (cfgs or configs(m, k, n))}


def bench(model: str, name: str, k: int, n: int, m: int) -> dict[str, Any]:
    from triton.testing import do_bench_cudagraph

    x, delta, norm_w, w = inputs(m, k, n, "cuda", torch.bfloat16)
    scale = float(unfused(x, delta, norm_w, w).float().abs().max())
    errors = check_configs(m, k, n, "cuda", torch.bfloat16)
    times = {}
    for cfg, err in errors.items():
        if err > 0.02 * scale + 1e-2:  # a config that computes something else is reported, never timed
            times[cfg] = float("nan")
            continue
        try:
            times[cfg] = do_bench_cudagraph(lambda cfg=cfg: fused(x, delta, norm_w, w, cfg), rep=20, return_mode="median") * 1e3
        except Exception as exc:  # noqa: BLE001 - out of resources: that config cannot run here
            times[cfg] = float("nan")
            print(f"{model} {name} M={m} {cfg}: {type(exc).__name__}", flush=True)
    base = do_bench_cudagraph(lambda: unfused(x, delta, norm_w, w), rep=20, return_mode="median") * 1e3
    ok = {c: t for c, t in times.items() if t == t}
    best = min(ok, key=ok.get) if ok else None
    by_bm = {bm: min((t for c, t in ok.items() if c[0] == bm), default=None) for bm in BLOCK_MS}
    row = {"model": model, "product": name, "K": k, "N": n, "M": m, "unfused_us": base,
           "best_fused_us": ok[best] if best else None, "best_config": best, "best_by_block_m_us": by_bm,
           "max_err": max(errors.values()), "scale": scale}
    print(f"{model:>9} {name:>8} K={k:>5} N={n:>6} M={m:>3}: unfused {base:7.1f} us, best fused "
          f"{row['best_fused_us'] or float('nan'):7.1f} us {best} | by BLOCK_M "
          + " ".join(f"{bm}:{(t if t is not None else float('nan')):.1f}" for bm, t in by_bm.items()), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2,qwen3-8b")
    p.add_argument("--rows", default=",".join(map(str, ROWS)))
    p.add_argument("--out", default=None, help="JSON of the rows")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_norm_linear times CUDA kernels: run it on a GPU (the tests check it on the CPU)")
    rows = [bench(model, name, k, n, int(m)) for model in args.models.split(",") for name, k, n in SHAPES[model]
            for m in args.rows.split(",")]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
