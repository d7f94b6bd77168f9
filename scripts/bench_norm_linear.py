"""The row kernels of `specbench.kernels.norm_linear` at tree-verify row counts, config by config (row tile
BLOCK_M included), against their unfused compositions:

- add+RMSNorm -> product (`_add_rmsnorm_linear_kernel`, one pass over K) against the RMSNorm kernel + cuBLAS;
- the MLP block against RMSNorm, cuBLAS, SiLU*up, cuBLAS: `add_rmsnorm_mlp` as it runs (the RMSNorm kernel, the
  gate/up product with SiLU*up as its epilogue, cuBLAS for down) and with the norm in the product's prologue
  (one pass: `_add_rmsnorm_gate_up_silu_kernel` + cuBLAS, whose configs are swept one by one).

    python scripts/bench_norm_linear.py --out bench_norm_linear.json      # CUDA, bf16; about two minutes

Shapes: SmolLM2-135M and Qwen3-8B (wqkv and the LM head after a norm; the MLP), at 17 and 65 rows (the
verify passes of budgets 16 and 64), random inputs. Each config is first checked against the unfused
result (it must agree to bf16 rounding), then timed by CUDA-graph replay (`triton.testing.do_bench_cudagraph`,
median); the unfused composition likewise. Prints, per shape and row count, the fastest config and the
unfused time. Under TRITON_INTERPRET=1 (the CPU) `check_configs` / `check_mlp_configs` run the
correctness half on small shapes (the tests do).
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

import torch
import triton

from specbench.kernels import norm_linear as nl

# (name, K, N): the products that follow an RMSNorm; the MLP: (K, I, hidden)
SHAPES = {
    "smollm2": [("wqkv", 576, 960), ("lm_head", 576, 49152)],
    "qwen3-8b": [("wqkv", 4096, 6144), ("lm_head", 4096, 151936)],
}
MLP = {"smollm2": (576, 1536, 576), "qwen3-8b": (4096, 12288, 4096)}
PLAIN = {"smollm2": [("wo", 576, 576), ("down", 1536, 576)], "qwen3-8b": [("wo", 4096, 4096), ("down", 12288, 4096)]}
ROWS = (17, 65)
BLOCK_MS = (16, 32, 64, 128)
TILES = [(16, 64, 4, 3), (16, 128, 4, 4), (16, 256, 4, 3), (32, 64, 4, 4), (32, 128, 4, 3), (64, 64, 4, 3),
         (64, 128, 8, 3), (128, 64, 8, 3)]  # (BLOCK_N, BLOCK_K, warps, stages)


def configs(m: int, k: int, n: int) -> list[tuple[int, int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) whose tiles do not exceed the padded shape; 8 warps where the
    row tile times the column slice passes 4K accumulators."""
    return [(bm, bn, bk, w if bm * bn <= 4096 else 8, s) for bm, (bn, bk, w, s) in itertools.product(BLOCK_MS, TILES)
            if bm <= max(16, triton.next_power_of_2(m)) and bn <= max(16, triton.next_power_of_2(n))
            and bk <= max(16, triton.next_power_of_2(k))]


def fused(x: torch.Tensor, delta: torch.Tensor | None, norm_w: torch.Tensor, w: torch.Tensor,
          cfg: tuple[int, int, int, int, int]) -> torch.Tensor:
    """The norm+product kernel at one explicit config (no autotuning): y [M, N] of rows x + delta [M, K];
    delta None: the plain product x @ w.T (the kernel without its norm)."""
    bm, bn, bk, warps, stages = cfg
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=w.dtype, device=x.device)
    resid = torch.empty_like(x)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    nl._add_rmsnorm_linear_kernel.fn[grid](
        x, x if delta is None else delta, norm_w, w, w, y, resid, m, n, k, max(bm, triton.next_power_of_2(m)), 1e-5,
        x.stride(0), x.stride(0), resid.stride(0), w.stride(0), y.stride(0),
        HAS_DELTA=delta is not None, HAS_BIAS=False, **nl._precision(w.dtype), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=warps, num_stages=stages, HAS_NORM=delta is not None)
    return y


def fused_gate_up_silu(x: torch.Tensor, delta: torch.Tensor, norm_w: torch.Tensor, w_gu: torch.Tensor,
                       cfg: tuple[int, int, int, int, int]) -> torch.Tensor:
    """The MLP's norm + gate/up + SiLU*up kernel at one explicit config: act [M, I]."""
    bm, bn, bk, warps, stages = cfg
    m, k = x.shape
    inter = w_gu.shape[0] // 2
    act = torch.empty(m, inter, dtype=w_gu.dtype, device=x.device)
    resid = torch.empty_like(x)
    grid = (triton.cdiv(m, bm) * triton.cdiv(inter, bn),)
    nl._add_rmsnorm_gate_up_silu_kernel.fn[grid](
        x, delta, norm_w, w_gu, act, resid, x, m, inter, k, max(bm, triton.next_power_of_2(m)), 1e-5, 0,
        x.stride(0), delta.stride(0), resid.stride(0), w_gu.stride(0), act.stride(0), 0,
        HAS_DELTA=True, **nl._precision(w_gu.dtype), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=warps, num_stages=stages)
    return act


def unfused(x: torch.Tensor, delta: torch.Tensor, norm_w: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return nl.add_rmsnorm_then_linear(x, delta, norm_w, 1e-5, w)[0]


def unfused_act(x: torch.Tensor, delta: torch.Tensor, norm_w: torch.Tensor, w_gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up by the unfused pieces (RMSNorm kernel, cuBLAS, SiLU*up kernel)."""
    return nl.silu_mul(unfused(x, delta, norm_w, w_gu))


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
    return {cfg: _max_diff(lambda cfg=cfg: fused(x, delta, norm_w, w, cfg), want) for cfg in (cfgs or configs(m, k, n))}


def _max_diff(run, want: torch.Tensor) -> float:
    """Max abs difference of run() from want; NaN for a config that cannot run here (out of shared memory)."""
    try:
        return float((run().float() - want).abs().max())
    except triton.runtime.errors.OutOfResources:
        return float("nan")


def check_mlp_configs(m: int, k: int, inter: int, device: str, dtype: torch.dtype,
                      cfgs: list[tuple[int, int, int, int, int]] | None = None) -> dict[tuple, float]:
    """Max abs difference of each config's SiLU*up activations from the unfused pieces'."""
    x, delta, norm_w, w_gu = inputs(m, k, 2 * inter, device, dtype)
    want = unfused_act(x, delta, norm_w, w_gu).float()
    return {cfg: _max_diff(lambda cfg=cfg: fused_gate_up_silu(x, delta, norm_w, w_gu, cfg), want)
            for cfg in (cfgs or configs(m, k, inter))}


def _time_configs(run, errors: dict[tuple, float], scale: float, label: str) -> dict[tuple, float]:
    from triton.testing import do_bench_cudagraph

    times = {}
    for cfg, err in errors.items():
        if not err <= 0.02 * scale + 1e-2:  # a config that computes something else (or cannot run) is never timed
            times[cfg] = float("nan")
            print(f"{label} {cfg}: " + ("cannot run here" if err != err else f"differs by {err:.3g} (scale {scale:.3g})"),
                  flush=True)
            continue
        try:
            times[cfg] = do_bench_cudagraph(lambda cfg=cfg: run(cfg), rep=20, return_mode="median") * 1e3
        except Exception as exc:  # noqa: BLE001 - out of resources: that config cannot run here
            times[cfg] = float("nan")
            print(f"{label} {cfg}: {type(exc).__name__}", flush=True)
    return times


def _summary(times: dict[tuple, float]) -> tuple[tuple | None, dict[int, float | None]]:
    ok = {c: t for c, t in times.items() if t == t}
    best = min(ok, key=ok.get) if ok else None
    return best, {bm: min((t for c, t in ok.items() if c[0] == bm), default=None) for bm in BLOCK_MS}


def bench(model: str, name: str, k: int, n: int, m: int) -> dict[str, Any]:
    from triton.testing import do_bench_cudagraph

    x, delta, norm_w, w = inputs(m, k, n, "cuda", torch.bfloat16)
    scale = float(unfused(x, delta, norm_w, w).float().abs().max())
    errors = check_configs(m, k, n, "cuda", torch.bfloat16)
    label = f"{model} {name} M={m}"
    times = _time_configs(lambda cfg: fused(x, delta, norm_w, w, cfg), errors, scale, label)
    base = do_bench_cudagraph(lambda: unfused(x, delta, norm_w, w), rep=20, return_mode="median") * 1e3
    best, by_bm = _summary(times)
    row = {"model": model, "product": name, "K": k, "N": n, "M": m, "unfused_us": base,
           "best_fused_us": times[best] if best else None, "best_config": best, "best_by_block_m_us": by_bm,
           "max_err": max((e for e in errors.values() if e == e), default=None), "scale": scale, "times_us": {str(c): t for c, t in times.items()}}
    print(f"{model:>9} {name:>8} K={k:>5} N={n:>6} M={m:>3}: unfused {base:7.1f} us, best fused "
          f"{row['best_fused_us'] or float('nan'):7.1f} us {best} | by BLOCK_M "
          + " ".join(f"{bm}:{(t if t is not None else float('nan')):.1f}" for bm, t in by_bm.items()), flush=True)
    return row


def bench_plain(model: str, name: str, k: int, n: int, m: int) -> dict[str, Any]:
    """A product with no prologue (wo, down): cuBLAS against the row kernel without its norm."""
    from triton.testing import do_bench_cudagraph

    x, _delta, norm_w, w = inputs(m, k, n, "cuda", torch.bfloat16)
    want = torch.nn.functional.linear(x, w)
    scale = float(want.float().abs().max())
    errors = {cfg: _max_diff(lambda cfg=cfg: fused(x, None, norm_w, w, cfg), want.float()) for cfg in configs(m, k, n)}
    times = _time_configs(lambda cfg: fused(x, None, norm_w, w, cfg), errors, scale, f"{model} {name} M={m}")
    base = do_bench_cudagraph(lambda: torch.nn.functional.linear(x, w), rep=20, return_mode="median") * 1e3
    best, by_bm = _summary(times)
    row = {"model": model, "product": name, "K": k, "N": n, "M": m, "cublas_us": base,
           "best_triton_us": times[best] if best else None, "best_config": best, "best_by_block_m_us": by_bm,
           "times_us": {str(c): t for c, t in times.items()}}
    print(f"{model:>9} {name:>8} K={k:>5} N={n:>6} M={m:>3}: cuBLAS  {base:7.1f} us, best Triton "
          f"{row['best_triton_us'] or float('nan'):7.1f} us {best}", flush=True)
    return row


def bench_mlp(model: str, m: int) -> dict[str, Any]:
    from triton.testing import do_bench_cudagraph

    k, inter, hidden = MLP[model]
    x, delta, norm_w, w_gu = inputs(m, k, 2 * inter, "cuda", torch.bfloat16)
    w_down = (torch.randn(hidden, inter, generator=torch.Generator().manual_seed(1)) / inter ** 0.5).to("cuda", torch.bfloat16)
    scale = float(unfused_act(x, delta, norm_w, w_gu).float().abs().max())
    errors = check_mlp_configs(m, k, inter, "cuda", torch.bfloat16)
    times = _time_configs(lambda cfg: fused_gate_up_silu(x, delta, norm_w, w_gu, cfg), errors, scale, f"{model} mlp M={m}")
    act = unfused_act(x, delta, norm_w, w_gu)

    def bench_us(fn) -> float:  # noqa: ANN001
        return do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3

    base = bench_us(lambda: nl.add_rmsnorm_mlp_then_linear(x, delta, norm_w, 1e-5, w_gu, w_down))
    down = bench_us(lambda: torch.nn.functional.linear(act, w_down))
    block = bench_us(lambda: nl.add_rmsnorm_mlp(x, delta, norm_w, 1e-5, w_gu, w_down))  # norm, then the epilogue kernel
    one_pass = bench_us(lambda: nl.add_rmsnorm_mlp(x, delta, norm_w, 1e-5, w_gu, w_down, True))  # the norm as prologue
    best, by_bm = _summary(times)
    row = {"model": model, "product": "mlp", "K": k, "I": inter, "N": hidden, "M": m, "unfused_block_us": base,
           "down_us": down, "fused_block_us": block, "one_pass_block_us": one_pass, "best_kernel_us": times[best] if best else None,
           "best_config": best, "best_by_block_m_us": by_bm, "max_err": max((e for e in errors.values() if e == e), default=None), "scale": scale,
           "times_us": {str(c): t for c, t in times.items()}}
    print(f"{model:>9}      mlp K={k:>5} I={inter:>6} M={m:>3}: unfused block {base:7.1f} us (down {down:.1f}), fused "
          f"block {block:7.1f} us (one pass {one_pass:.1f}), best one-pass kernel {row['best_kernel_us'] or float('nan'):7.1f} us {best} | by BLOCK_M "
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
    rows = []
    for model in args.models.split(","):
        for m in map(int, args.rows.split(",")):
            rows.append(bench_mlp(model, m))
            rows += [bench(model, name, k, n, m) for name, k, n in SHAPES[model]]
            rows += [bench_plain(model, name, k, n, m) for name, k, n in PLAIN[model]]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
