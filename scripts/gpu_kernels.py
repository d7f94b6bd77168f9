#!/usr/bin/env python3
"""One GPU job for the Triton kernels of issue 7 (tree attention, tree_accept, kv_compact).

  (0) ceilings: device-to-device copy bandwidth and the bf16 matrix rate, measured in this run
  (a) correctness at full size on fresh random inputs vs the references (outputs poisoned first)
  (b) tree attention vs SDPA with a dense boolean mask vs FlexAttention (compiled, block mask):
      Qwen3-8B and SmolLM2 head shapes, C in {1k, 4k, 16k, 32k}, N in {16, 64, 256}, bf16
  (c) tree_accept + kv_compact per round at N = 256, next to a verify pass (random-weight forward)
  (d) the gpu-marked kernel tests (pytest, in a subprocess)
Every section runs in try/except and the job keeps to a time budget; FlexAttention (slow to compile)
runs last on what time is left. A compact table is printed last; everything is in $OUT/gpu_kernels.json.

  python3 scripts/gpu_kernels.py              # the H200 job (< 8 minutes)
  python3 scripts/gpu_kernels.py --dry-run    # CPU + Triton interpreter, tiny shapes: checks the plumbing
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ARGS = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ARGS.add_argument("--dry-run", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes")
ARGS.add_argument("--budget", type=float, default=450.0, help="seconds for the whole job (default 450)")
ARGS.add_argument("--skip", default="", help="comma-separated sections to skip: a,b,c,d,flex")
OPTS = ARGS.parse_args()
if OPTS.dry_run:
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the GPU machine has no `pip install -e .`

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from specbench.kernels.kv_compact import kv_compact  # noqa: E402
from specbench.kernels.masks import block_causal_mask, pack_tree_mask  # noqa: E402
from specbench.kernels.reference import (  # noqa: E402
    context_attention_reference,
    kv_compact_reference,
    tree_accept_reference,
    tree_attention_reference,
)
from specbench.kernels.tree_accept import tree_accept  # noqa: E402
from specbench.kernels.tree_attention import (  # noqa: E402
    attention_bytes,
    attention_flops,
    context_attention,
    plan_attention,
    tree_attention,
)

DRY = OPTS.dry_run
DEV = torch.device("cpu" if DRY else "cuda")
START = time.perf_counter()
SKIP = set(filter(None, OPTS.skip.split(",")))
OUT = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu_kernels_"))
OUT.mkdir(parents=True, exist_ok=True)
L2_BYTES = 60 * 2**20 if DRY else torch.cuda.get_device_properties(DEV).L2_cache_size
# name: (query heads, KV heads, head dim, layers, vocab, model preset)
if DRY:
    SHAPES = {"qwen3-8b": (8, 2, 128, 2, 96, "tiny-qwen3"), "smollm2": (3, 1, 64, 2, 96, "tiny-llama")}
    CONTEXTS, NODES, ROUND_C = (64, 200), (4, 16), 64
else:
    SHAPES = {"qwen3-8b": (32, 8, 128, 36, 151936, "qwen3-8b-shape"),
              "smollm2": (9, 3, 64, 30, 49152, "smollm2-135m-shape")}
    CONTEXTS, NODES, ROUND_C = (1024, 4096, 16384, 32768), (16, 64, 256), 4096
ROUND_N = NODES[-1]
RESULTS: dict = {"device": "cpu (dry run)" if DRY else torch.cuda.get_device_name(DEV), "torch": torch.__version__,
                 "dry_run": DRY, "sections": {}}


def elapsed() -> float:
    return time.perf_counter() - START


def left() -> float:
    return OPTS.budget - elapsed()


def log(msg: str) -> None:
    print(f"[{elapsed():6.1f}s] {msg}", flush=True)


def section(name: str):
    """Decorator: run the section, record its time and any traceback, never raise."""
    def wrap(fn):
        def run(*a, **kw):
            if name in SKIP:
                log(f"section {name}: skipped (--skip)")
                return None
            t0 = time.perf_counter()
            log(f"section {name}: start")
            try:
                out = fn(*a, **kw)
                RESULTS["sections"][name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 1)}
                return out
            except Exception:
                tb = traceback.format_exc()
                print(tb, flush=True)
                RESULTS["sections"][name] = {"ok": False, "seconds": round(time.perf_counter() - t0, 1), "error": tb[-2000:]}
                return None
            finally:
                if DEV.type == "cuda":
                    torch.cuda.empty_cache()
                save()
        return run
    return wrap


def save() -> None:
    (OUT / "gpu_kernels.json").write_text(json.dumps(RESULTS, indent=1, default=str))


# ---- inputs --------------------------------------------------------------------------------------
def random_tree(n: int, gen: torch.Generator, max_back: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """parents [n] (root -1, parents[i] in [i - max_back, i)) and the ancestor mask [n, n] bool."""
    parents = [-1] + [int(torch.randint(max(0, i - max_back), i, (1,), generator=gen)) for i in range(1, n)]
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    return torch.tensor(parents), mask


def randn(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, device=DEV, dtype=dtype)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


# ---- timing --------------------------------------------------------------------------------------
def time_calls(step, n_bufs: int, reps: int = 10, min_calls: int = 16, graph: bool = True) -> tuple[float, str]:
    """Median seconds per call of step(i), i cycling over n_bufs input sets (so repeated calls do
    not measure the L2 cache). On CUDA, the calls are captured in one graph and its replays are
    timed with events (launch gaps as in a graph-captured decoder); fallback: events around a loop."""
    calls = max(n_bufs, 2 if DRY else min_calls)
    reps = 2 if DRY else reps
    for i in range(n_bufs):
        step(i)  # compile / warm up on every input set
    if DEV.type != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for i in range(calls):
                step(i % n_bufs)
            times.append((time.perf_counter() - t0) / calls)
        return statistics.median(times), "host"
    torch.cuda.synchronize()
    method = "graph"
    run = None
    if graph:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(calls):
                    step(i % n_bufs)
            g.replay()
            torch.cuda.synchronize()
            run = g.replay
        except Exception as exc:  # noqa: BLE001
            method = f"events ({type(exc).__name__}: {str(exc)[:80]})"
            torch.cuda.synchronize()
    if run is None:
        method = method if method != "graph" else "events"

        def run() -> None:
            for i in range(calls):
                step(i % n_bufs)
    run()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / calls)
    return statistics.median(times), method


def host_time(fn, reps: int = 30) -> float:
    """Median wall seconds of fn() (which must end with its own host sync)."""
    fn()
    times = []
    for _ in range(2 if DRY else reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---- (0) ceilings --------------------------------------------------------------------------------
@section("ceilings")
def ceilings() -> None:
    n = (8 if DRY else 512) * 2**20  # bf16 elements: 1 GiB
    src = randn(n, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t, method = time_calls(lambda i: dst.copy_(src), 1, reps=10, min_calls=4, graph=False)
    copy_bw = 2 * src.numel() * 2 / t
    del src, dst
    m = 1024 if DRY else 8192
    a, b = randn(m, m, dtype=torch.bfloat16), randn(m, m, dtype=torch.bfloat16)
    t_mm, _ = time_calls(lambda i: a @ b, 1, reps=5, min_calls=4, graph=False)
    RESULTS["copy_bw"] = copy_bw
    RESULTS["matmul_flops"] = 2 * m**3 / t_mm
    log(f"copy {copy_bw / 1e12:.2f} TB/s (read + write), bf16 matmul {RESULTS['matmul_flops'] / 1e12:.0f} TFLOP/s")


# ---- (a) correctness -----------------------------------------------------------------------------
@section("a")
def correctness() -> None:
    seed = int(time.time())  # fresh inputs every run, recorded
    RESULTS["correctness_seed"] = seed
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    tol = {torch.bfloat16: 1e-2, torch.float32: 1e-5}
    ctx_points = [(0, 1), (37, 5), (CONTEXTS[1], NODES[0]), (CONTEXTS[1], NODES[-1]), (CONTEXTS[-1], NODES[1])]
    for shape, (h, hkv, d, *_rest) in SHAPES.items():
        for dtype in (torch.bfloat16, torch.float32):
            for c, n in ctx_points:
                for forced_splits in (None, 1, 7):
                    if forced_splits is not None and (c, n) != ctx_points[2]:
                        continue
                    lengths = [c, c // 2 + 3] if c else [0, 0]  # two rows at different lengths
                    slots = c + n + 8
                    q = randn(2, h, n, d, dtype=dtype)
                    k = randn(2, hkv, slots, d, dtype=dtype)
                    v = randn(2, hkv, slots, d, dtype=dtype)
                    lens = torch.tensor(lengths, device=DEV)
                    bits = pack_tree_mask(torch.stack([random_tree(n, gen)[1] for _ in range(2)]).to(DEV))
                    cfg = plan_attention(2, hkv, h // hkv, n, c, DEV, dtype)
                    if forced_splits is not None:
                        cfg = dataclasses.replace(cfg, num_splits=forced_splits)
                    out = torch.full_like(q, float("nan"))
                    tree_attention(q, k, v, lens, bits, d ** -0.5, kv_len=c + n, config=cfg, out=out)
                    ref = tree_attention_reference(q, k, v, lens, bits, d ** -0.5)
                    err = rel_err(out, ref)
                    rows.append({"op": "tree_attention", "shape": shape, "dtype": str(dtype), "C": c, "N": n,
                                 "splits": cfg.num_splits, "rel_err": err, "ok": err <= tol[dtype]})
        # draft heads: injected context K/V, separate new K/V, block-causal (not lower triangular) mask
        for dtype in (torch.bfloat16, torch.float32):
            n, c = 16, CONTEXTS[1] // 2
            q = randn(1, h, n, d, dtype=dtype)
            ctx_k, ctx_v = randn(1, hkv, c, d, dtype=dtype), randn(1, hkv, c, d, dtype=dtype)
            new_k, new_v = randn(1, hkv, n, d, dtype=dtype), randn(1, hkv, n, d, dtype=dtype)
            lens = torch.tensor([c], device=DEV)
            bits = pack_tree_mask(block_causal_mask(n, 4, DEV)[None])
            out = torch.full_like(q, float("nan"))
            context_attention(q, ctx_k, ctx_v, lens, new_k, new_v, bits, d ** -0.5, out=out)
            ref = context_attention_reference(q, ctx_k, ctx_v, lens, new_k, new_v, bits, d ** -0.5)
            err = rel_err(out, ref)
            rows.append({"op": "context_attention", "shape": shape, "dtype": str(dtype), "C": c, "N": n,
                         "rel_err": err, "ok": err <= tol[dtype]})
    for n in (16, 256, 1024):
        for vocab in (2, 1000):
            bad = 0
            for _ in range(2 if DRY else 10):
                parents, _mask = random_tree(n, gen, max_back=4)
                tokens = torch.randint(0, vocab, (n,), generator=gen)
                argmax = torch.randint(0, vocab, (n,), generator=gen)
                node = int(torch.randint(0, n, (1,), generator=gen))
                while parents[node] >= 0:  # plant a deep accepted path
                    argmax[parents[node]] = tokens[node]
                    node = int(parents[node])
                got = tree_accept(tokens.to(DEV), parents.to(DEV), argmax.to(DEV)).packed.cpu()
                bad += not torch.equal(got, tree_accept_reference(tokens, parents, argmax))
            rows.append({"op": "tree_accept", "N": n, "vocab": vocab, "mismatches": bad, "ok": bad == 0})
    for shape, (h, hkv, d, layers, *_rest) in SHAPES.items():
        k = randn(layers, 1, hkv, ROUND_C + ROUND_N + 8, d, dtype=torch.bfloat16)
        v = randn(layers, 1, hkv, ROUND_C + ROUND_N + 8, d, dtype=torch.bfloat16)
        for length in sorted({1, 9, min(100, ROUND_N), ROUND_N}):
            rest = torch.randperm(ROUND_N - 1, generator=gen)[: length - 1].sort().values + 1
            path = torch.cat([torch.zeros(1, dtype=torch.long), rest, torch.full((ROUND_N - length,), -1)])[None]
            base = torch.tensor([ROUND_C], device=DEV)
            k_ref, v_ref = k.clone(), v.clone()
            kv_compact(k, v, path.to(DEV), base)
            kv_compact_reference(k_ref, v_ref, path.to(DEV), base)
            same = bool(torch.equal(k, k_ref) and torch.equal(v, v_ref))
            rows.append({"op": "kv_compact", "shape": shape, "P": length, "ok": same})
        del k, v, k_ref, v_ref
    RESULTS["correctness"] = rows
    fails = [r for r in rows if not r["ok"]]
    log(f"correctness: {len(rows) - len(fails)}/{len(rows)} ok" + (f"; FAILED: {fails}" if fails else ""))


# ---- (b) attention benchmark ---------------------------------------------------------------------
def _bench_inputs(h: int, hkv: int, d: int, c: int, n: int, gen: torch.Generator):
    per_layer = attention_bytes(1, hkv, c, n, d, 2)
    n_bufs = 2 if DRY else max(2, min(128, math.ceil(3 * L2_BYTES / per_layer)))  # > 3x L2, like distinct layers
    q = randn(n_bufs, 1, h, n, d, dtype=torch.bfloat16)
    k = randn(n_bufs, 1, hkv, c + n, d, dtype=torch.bfloat16)
    v = randn(n_bufs, 1, hkv, c + n, d, dtype=torch.bfloat16)
    _parents, mask = random_tree(n, gen)
    return q, k, v, mask.to(DEV), n_bufs


def _variants(plan, head_dim: int):
    """The planned config and a few neighbours (chosen to compile without spills on sm_90), to see
    how far the plan is from the best."""
    out = [plan, dataclasses.replace(plan, num_splits=max(1, plan.num_splits // 2)),
           dataclasses.replace(plan, num_splits=min(64, plan.num_splits * 2))]
    if plan.block_m == 128:
        out.append(dataclasses.replace(plan, block_m=64, num_warps=4))
    elif head_dim == 128:
        out.append(dataclasses.replace(plan, num_stages=4))
    else:
        out.append(dataclasses.replace(plan, block_s=128, num_stages=2))
    seen, unique = set(), []
    for cfg in out:
        if cfg not in seen:
            seen.add(cfg)
            unique.append(cfg)
    return unique[:2] if DRY else unique


@section("b")
def bench_attention() -> None:
    from specbench.models.decoder import attention_mask

    gen = torch.Generator().manual_seed(1)
    rows = []
    for shape, (h, hkv, d, *_rest) in SHAPES.items():
        for c in CONTEXTS:
            for n in NODES:
                if left() < 0.3 * OPTS.budget:
                    log(f"b: time budget reached, skipping {shape} C={c} N={n}")
                    continue
                q, k, v, mask, n_bufs = _bench_inputs(h, hkv, d, c, n, gen)
                lens = torch.tensor([c], device=DEV)
                bits = pack_tree_mask(mask[None])
                scale = d ** -0.5
                row = {"shape": shape, "C": c, "N": n, "buffers": n_bufs,
                       "kv_bytes": attention_bytes(1, hkv, c, n, d, 2), "flops": attention_flops(1, h, c, n, d)}
                plan = plan_attention(1, hkv, h // hkv, n, c, DEV)
                outs = torch.empty_like(q)
                ref_out = None
                variants = []
                for cfg in _variants(plan, d):
                    try:
                        t, method = time_calls(lambda i, cfg=cfg: tree_attention(
                            q[i], k[i], v[i], lens, bits, scale, kv_len=c + n, config=cfg, out=outs[i]), n_bufs)
                        agree = None
                        if ref_out is None:
                            ref_out = outs[0].clone()
                        else:
                            agree = rel_err(outs[0], ref_out)
                        variants.append({"config": dataclasses.asdict(cfg), "us": t * 1e6, "timing": method,
                                         "rel_diff_vs_plan": agree})
                    except Exception as exc:  # noqa: BLE001
                        variants.append({"config": dataclasses.asdict(cfg), "error": repr(exc)[:300]})
                row["triton"] = variants
                timed = [x for x in variants if "us" in x]
                if timed:
                    row["triton_plan_us"] = timed[0]["us"] if variants[0] is timed[0] else None
                    row["triton_best_us"] = min(x["us"] for x in timed)
                dense = attention_mask(lens, mask[None], c + n)  # [1, 1, N, C+N], once per forward
                try:
                    def sdpa(i):
                        return F.scaled_dot_product_attention(q[i], k[i], v[i], attn_mask=dense, scale=scale,
                                                              enable_gqa=True)

                    t, method = time_calls(sdpa, n_bufs)
                    row["sdpa_us"], row["sdpa_timing"] = t * 1e6, method
                    if ref_out is not None:
                        row["sdpa_rel_diff"] = rel_err(ref_out, sdpa(0))
                except Exception as exc:  # noqa: BLE001
                    row["sdpa_error"] = repr(exc)[:300]
                rows.append(row)
                log(f"b: {shape} C={c} N={n}: triton plan {row.get('triton_plan_us') or float('nan'):.1f} us, "
                    f"best {row.get('triton_best_us', float('nan')):.1f} us, sdpa {row.get('sdpa_us', float('nan')):.1f} us")
                del q, k, v, outs, dense
                RESULTS["attention"] = rows
                save()
    RESULTS["attention"] = rows


@section("flex")
def bench_flex() -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    flex = flex_attention if DRY else torch.compile(flex_attention)
    gen = torch.Generator().manual_seed(1)
    by_key = {(r["shape"], r["C"], r["N"]): r for r in RESULTS.get("attention", [])}
    for shape, (h, hkv, d, *_rest) in SHAPES.items():
        for n in NODES:  # N outer: a shape change of N recompiles; C then varies on a dynamic kernel
            for c in CONTEXTS:
                row = by_key.get((shape, c, n))
                if row is None:
                    continue
                if left() < 25:
                    row["flex_error"] = "skipped: time budget"
                    continue
                try:
                    q, k, v, mask, n_bufs = _bench_inputs(h, hkv, d, c, n, gen)

                    def mask_mod(b, hh, q_idx, kv_idx, mask=mask, c=c, n=n):
                        j = kv_idx - c
                        return (kv_idx < c) | ((j >= 0) & (j < n) & mask[q_idx, j.clamp(0, n - 1)])

                    block_mask = create_block_mask(mask_mod, None, None, n, c + n, device=DEV)

                    def run_flex(i, q=q, k=k, v=v, block_mask=block_mask, d=d):
                        return flex(q[i], k[i], v[i], block_mask=block_mask, scale=d ** -0.5, enable_gqa=True)

                    t0 = time.perf_counter()
                    t, method = time_calls(run_flex, n_bufs)
                    row["flex_us"], row["flex_timing"] = t * 1e6, method
                    row["flex_compile_and_time_s"] = time.perf_counter() - t0
                    ref = tree_attention(q[0], k[0], v[0], torch.tensor([c], device=DEV), pack_tree_mask(mask[None]),
                                         d ** -0.5)
                    row["flex_rel_diff"] = rel_err(run_flex(0), ref)
                    log(f"flex: {shape} C={c} N={n}: {t * 1e6:.1f} us ({method})")
                    del q, k, v, block_mask
                except Exception as exc:  # noqa: BLE001
                    row["flex_error"] = repr(exc)[:300]
                    log(f"flex: {shape} C={c} N={n}: {repr(exc)[:200]}")
                save()


# ---- (c) per-round costs -------------------------------------------------------------------------
def _random_model(preset: str):
    """Random bf16 weights initialised on the device (the loader's CPU init is slow for 8B)."""
    from specbench.models.config import PRESETS
    from specbench.models.decoder import Transformer, rope_inv_freq

    cfg = PRESETS[preset]
    with torch.device("meta"):
        model = Transformer(cfg)
    model = model.to(dtype=torch.bfloat16).to_empty(device=DEV)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
        model.inv_freq.copy_(rope_inv_freq(cfg).float())
    return model.eval().requires_grad_(False)


def _forward_times(preset: str, n: int, c: int, gen: torch.Generator) -> dict:
    """A verify pass (N tree tokens at context C, logits for every node) and one AR step per
    attention backend, on one random-weight model; each call captured in a CUDA graph when possible."""
    model = _random_model(preset)
    cache = model.new_cache(1, c + n + 8)
    cache.k.normal_()
    cache.v.normal_()
    cache.advance(c)
    _parents, mask = random_tree(n, gen)
    depth = mask.sum(-1) - 1
    tokens = torch.randint(0, model.config.vocab_size, (1, n), generator=gen).to(DEV)
    positions = (c + depth).to(DEV)[None]
    tree_mask = mask.to(DEV)[None]
    one_tok, one_pos = tokens[:, :1], torch.tensor([[c]], device=DEV)
    out: dict = {}
    for attention in ("triton", "sdpa"):
        try:
            model.set_attention(attention)
            with torch.inference_mode():
                t, method = time_calls(lambda i: model(tokens, positions, cache, tree_mask, kv_len=c + n), 1,
                                       reps=5, min_calls=3)
                out[f"verify_forward_{attention}_ms"], out[f"forward_{attention}_timing"] = t * 1e3, method
                t, _ = time_calls(lambda i: model(one_tok, one_pos, cache, None, kv_len=c + 1), 1, reps=5, min_calls=3)
                out[f"ar_step_{attention}_ms"] = t * 1e3
        except Exception as exc:  # noqa: BLE001
            out[f"forward_{attention}_error"] = repr(exc)[:300]
            traceback.print_exc()
    del model, cache
    return out


@section("c")
def bench_round() -> None:
    from specbench.config import SamplingConfig
    from specbench.trees.base import DraftTree
    from specbench.verify import VERIFIERS
    from specbench.verify.base import TorchRandomness

    gen = torch.Generator().manual_seed(2)
    greedy, sampling, rng = VERIFIERS.build("greedy"), SamplingConfig(temperature=0.0), TorchRandomness(0)
    rows = []
    for shape, (h, hkv, d, layers, vocab, preset) in SHAPES.items():
        if left() < 0.2 * OPTS.budget:
            log(f"c: time budget reached, skipping {shape}")
            continue
        n, c = ROUND_N, ROUND_C
        row: dict = {"shape": shape, "N": n, "C": c, "layers": layers}
        k = randn(layers, 1, hkv, c + n + 8, d, dtype=torch.bfloat16)
        v = randn(layers, 1, hkv, c + n + 8, d, dtype=torch.bfloat16)
        parents, mask = random_tree(n, gen)
        depth = mask.sum(-1) - 1
        tokens = torch.randint(0, vocab, (n,), generator=gen)
        argmax = torch.randint(0, vocab, (n,), generator=gen)
        node = max((i for i in range(n) if depth[i] <= 8), key=lambda i: int(depth[i]))  # accept ~8 drafts
        while parents[node] >= 0:
            argmax[parents[node]] = tokens[node]
            node = int(parents[node])
        logits = randn(n, vocab, dtype=torch.bfloat16)
        logits.scatter_(1, argmax.to(DEV)[:, None], 10.0)
        tok_d, par_d = tokens.to(DEV), parents.to(DEV)
        base = torch.tensor([c], device=DEV)
        expect = tree_accept_reference(tokens, parents, argmax)
        row["accepted_path_len"] = int(expect[0])

        def gpu_round():
            res = tree_accept(tok_d, par_d, logits=logits)
            kv_compact(k, v, res.path[None], base)
            return res

        row["accept_matches_reference"] = bool(torch.equal(gpu_round().packed.cpu(), expect))
        t, method = time_calls(lambda i: gpu_round(), 1, min_calls=20)
        row["gpu_accept_compact_us"], row["gpu_timing"] = t * 1e6, method
        t_acc, _ = time_calls(lambda i: tree_accept(tok_d, par_d, logits=logits), 1, min_calls=20)
        row["gpu_argmax_accept_us"] = t_acc * 1e6
        row["gpu_round_host_us"] = host_time(lambda: gpu_round().packed.tolist()) * 1e6

        tree = DraftTree(tokens=tok_d, parents=par_d, depth=depth.to(DEV))  # host lists cached: favours torch

        def torch_round():
            res = greedy.verify(tree, logits, sampling, rng)  # argmax().tolist() + Python walk
            path = torch.tensor(res.path, device=DEV)
            src, dst = c + path, torch.arange(c, c + path.numel(), device=DEV)
            for buf in (k, v):  # what KVCache.commit does
                buf[:, 0].index_copy_(2, dst, buf[:, 0].index_select(2, src))
            if DEV.type == "cuda":
                torch.cuda.synchronize()

        row["torch_round_host_us"] = host_time(torch_round) * 1e6
        del k, v
        att = {(r["shape"], r["C"], r["N"]): r for r in RESULTS.get("attention", [])}.get((shape, c, n))
        if att and att.get("triton_plan_us"):
            row["attention_x_layers_us"] = att["triton_plan_us"] * layers
        row.update(_forward_times(preset, n, c, gen))
        if DEV.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        log(f"c: {shape}: " + json.dumps({k2: round(v2, 1) if isinstance(v2, float) else v2 for k2, v2 in row.items()}))
        RESULTS["round"] = rows
    RESULTS["round"] = rows


# ---- (d) gpu-marked tests ------------------------------------------------------------------------
@section("d")
def gpu_tests() -> None:
    timeout = max(30.0, left() - 100.0)  # leave time for FlexAttention and the table
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/kernels", "-p", "no:cacheprovider"]  # -q from addopts
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        text, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        text, code = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMEOUT after {timeout:.0f}s", -1
    (OUT / "pytest_gpu.txt").write_text(text if isinstance(text, str) else text.decode())
    summary = [line for line in str(text).splitlines() if line.strip()][-1:] or ["(no output)"]
    RESULTS["pytest_gpu"] = {"returncode": code, "summary": summary[0]}
    log(f"pytest -m gpu: rc={code} {summary[0]}")


# ---- table -------------------------------------------------------------------------------------
def table() -> str:
    lines = []
    copy_bw, mm = RESULTS.get("copy_bw"), RESULTS.get("matmul_flops")
    lines.append(f"device {RESULTS['device']} | torch {RESULTS['torch']} | copy {copy_bw and copy_bw / 1e12 or float('nan'):.2f} TB/s "
                 f"| bf16 mm {mm and mm / 1e12 or float('nan'):.0f} TFLOP/s | elapsed {elapsed():.0f}s")
    corr = RESULTS.get("correctness")
    if corr:
        worst = {}
        for r in corr:
            if "rel_err" in r:
                worst[r["dtype"]] = max(worst.get(r["dtype"], 0.0), r["rel_err"])
        fails = [f"{r['op']}:{r.get('shape', '')}:{r.get('C', '')}:{r.get('N', r.get('P', ''))}" for r in corr if not r["ok"]]
        lines.append(f"correctness {sum(r['ok'] for r in corr)}/{len(corr)} ok; worst rel err "
                     + ", ".join(f"{k.replace('torch.', '')} {v:.1e}" for k, v in worst.items())
                     + (f"; FAILED {fails}" if fails else ""))
    att = RESULTS.get("attention", [])
    if att:
        lines.append(f"{'shape':9} {'C':>6} {'N':>4} {'plan_us':>8} {'best_us':>8} {'best cfg (m,s,w,st,sp)':>24} "
                     f"{'%copy':>6} {'%floor':>6} {'sdpa_us':>9} {'x_sdpa':>6} {'flex_us':>8} {'x_flex':>6}")
        for r in att:
            timed = [x for x in r.get("triton", []) if "us" in x]
            best = min(timed, key=lambda x: x["us"]) if timed else None
            best_us = best["us"] if best else float("nan")
            cfg = best["config"] if best else {}
            cfg_s = ",".join(str(cfg.get(k2, "?")) for k2 in ("block_m", "block_s", "num_warps", "num_stages", "num_splits"))
            plan_us = r.get("triton_plan_us") or float("nan")
            pct = r["kv_bytes"] / (plan_us * 1e-6) / copy_bw * 100 if copy_bw else float("nan")
            floor = max(r["kv_bytes"] / copy_bw, r["flops"] / mm) * 1e6 if copy_bw and mm else float("nan")
            sdpa, flex = r.get("sdpa_us", float("nan")), r.get("flex_us", float("nan"))
            lines.append(f"{r['shape']:9} {r['C']:>6} {r['N']:>4} {plan_us:>8.1f} {best_us:>8.1f} {cfg_s:>24} "
                         f"{pct:>6.0f} {floor / plan_us * 100:>6.0f} {sdpa:>9.1f} {sdpa / plan_us:>6.1f} "
                         f"{flex:>8.1f} {flex / plan_us:>6.1f}")
    for r in RESULTS.get("round", []):
        lines.append(
            f"round {r['shape']} N={r['N']} C={r['C']} P={r['accepted_path_len']} ok={r['accept_matches_reference']}: "
            f"gpu argmax+accept+compact {r.get('gpu_accept_compact_us', float('nan')):.1f} us (argmax+accept "
            f"{r.get('gpu_argmax_accept_us', float('nan')):.1f}), host round {r.get('gpu_round_host_us', float('nan')):.0f} us "
            f"vs torch path {r.get('torch_round_host_us', float('nan')):.0f} us | verify fwd triton "
            f"{r.get('verify_forward_triton_ms', float('nan')):.2f} ms, sdpa {r.get('verify_forward_sdpa_ms', float('nan')):.2f} ms"
            f" | AR step triton {r.get('ar_step_triton_ms', float('nan')):.2f} ms, sdpa {r.get('ar_step_sdpa_ms', float('nan')):.2f} ms"
            f" | attention x layers {r.get('attention_x_layers_us', float('nan')) / 1e3:.2f} ms")
    if "pytest_gpu" in RESULTS:
        lines.append(f"pytest -m gpu tests/kernels: rc={RESULTS['pytest_gpu']['returncode']} {RESULTS['pytest_gpu']['summary']}")
    bad = [k2 for k2, s in RESULTS["sections"].items() if not s["ok"]]
    lines.append("sections: " + ", ".join(f"{k2} {s['seconds']}s{'' if s['ok'] else ' FAILED'}" for k2, s in RESULTS["sections"].items())
                 + (f" | failed: {bad} (tracebacks above and in the JSON)" if bad else ""))
    return "\n".join(lines)


def main() -> None:
    log(f"{RESULTS['device']}, torch {torch.__version__}, out {OUT}")
    ceilings()
    correctness()
    bench_attention()
    bench_round()
    gpu_tests()
    bench_flex()
    text = table()
    (OUT / "table.txt").write_text(text)
    save()
    print("\n" + text, flush=True)


if __name__ == "__main__":
    main()
