"""Where a training step's time goes, and what bf16 autocast and a larger batch buy (issue 14's throughput).

    python scripts/bench_train_step.py --corpus /root/corpus --device cuda [--heads dflash,jetspec,...] \
        [--variants none/16,bf16/16,none/16/chain] [--steps 8] [--warmup 3] [--profile] [--json OUT] [--choose OUT]
    python scripts/bench_train_step.py --target random:tiny-llama --synthetic 24 --device cpu --steps 2   # dry run

Each variant AUTOCAST/BATCH[/chain] is a fresh `Trainer` (the heads as `specbench train` builds them) over the same
sequences: the corpus's training split, or --synthetic N random sequences of corpus-like lengths ("/chain": with
the forward KL as its autograd chain, SPECBENCH_FUSED_KL=0, where CUDA otherwise runs `kernels/kl_loss.py`). After
--warmup steps it times --steps steps twice: the whole `Trainer.train_step` (wall clock to a device sync:
what a run gets), and the same steps split by CUDA events into the target forward and each head's
loss, backward, clip and optimizer step (`Trainer.objective_step`). It also compares each head's loss on
the first batch with the first variant's (same batch size, same draws: they differ by rounding only).

--profile: torch.profiler over --profile-steps steps of the fastest variant: the top kernels by device time,
and device busy time / wall time (near 1: kernel-bound; far below: the host's launches and waits bound it).
--choose FILE: writes "AUTOCAST BATCH" for training (scripts/gpu_pipeline.sh's trainbench): the first variant's
batch, with bf16 autocast for the heads whose part the bf16 variant made faster by --min-gain, provided it kept
every first-step loss within --loss-tol of the first variant's (what pays differs by head: on the H200 it
sped jetspec++ up and slowed eagle3 down 13x); a choice of some heads only is timed as one more row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


KL_PATHS = ("fused", "chain")  # the forward KL's kernels on CUDA, or its autograd chain (SPECBENCH_FUSED_KL=0)


def parse_variants(text: str) -> list[tuple[str, int, str]]:
    """"none/16,bf16/32,none/16/chain" -> [("none", 16, "fused"), ("bf16", 32, "fused"), ("none", 16, "chain")]."""
    from specbench.train.trainer import AUTOCASTS

    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        autocast, _, rest = item.partition("/")
        batch, _, kl = rest.partition("/")
        kl = kl or "fused"
        if autocast not in AUTOCASTS or not batch.isdigit() or int(batch) < 1 or kl not in KL_PATHS:
            raise ValueError(f"--variants takes AUTOCAST/BATCH[/chain] items (AUTOCAST one of {AUTOCASTS}), got {item!r}")
        out.append((autocast, int(batch), kl))
    if not out:
        raise ValueError("--variants names no variant")
    return out


def synthetic_store(vocab: int, n: int, seed: int = 0) -> Any:
    """n random sequences with prompt and response lengths spread like the corpus's (prompts 30-380
    tokens, responses 40-256)."""
    from specbench.train.sequences import TokenStore, TrainingSequence

    g = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(n):
        p = int(torch.randint(30, 381, (1,), generator=g))
        r = int(torch.randint(40, 257, (1,), generator=g))
        seqs.append(TrainingSequence(prompt=torch.randint(vocab, (p,), generator=g).tolist(),
                                     response=torch.randint(vocab, (r,), generator=g).tolist()))
    return TokenStore.from_sequences(seqs)


class Marks:
    """Time points on the device's stream (CUDA events) or the host clock (CPU ops run synchronously)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.points: list[tuple[str, Any]] = []

    def mark(self, label: str) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.points.append((label, ev))
        else:
            self.points.append((label, time.perf_counter()))

    def spans_ms(self) -> dict[str, float]:
        """label -> ms from the previous mark to this one."""
        if self.cuda:
            torch.cuda.synchronize()
        out = {}
        for (_, a), (label, b) in zip(self.points, self.points[1:]):
            out[label] = a.elapsed_time(b) if self.cuda else 1e3 * (b - a)
        return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_trainer(args: argparse.Namespace, target: Any, store: Any, autocast: str, batch: int, out: Path) -> Any:
    from specbench.train.cli import build_objectives, parse_drafters, parse_head_args
    from specbench.train.trainer import TrainConfig, Trainer

    labels = parse_drafters(args.heads)
    objectives = build_objectives(target, labels, parse_head_args(args.head_arg, list(labels)))
    config = TrainConfig(batch_size=batch, max_len=args.max_len, steps=1_000_000, lr=args.lr, schedule="wsd",
                         save_every=0, seed=0, autocast=autocast)
    return Trainer(target, objectives, store, config, out)


def time_variant(args: argparse.Namespace, target: Any, store: Any, autocast: str, batch: int,
                 kl: str = "fused") -> dict[str, Any]:
    saved = os.environ.get("SPECBENCH_FUSED_KL")
    os.environ["SPECBENCH_FUSED_KL"] = "0" if kl == "chain" else "1"
    try:
        return _time_variant(args, target, store, autocast, batch, kl)
    finally:
        if saved is None:
            os.environ.pop("SPECBENCH_FUSED_KL", None)
        else:
            os.environ["SPECBENCH_FUSED_KL"] = saved


def _time_variant(args: argparse.Namespace, target: Any, store: Any, autocast: str, batch: int, kl: str) -> dict[str, Any]:
    device = target.device
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(args, target, store, autocast, batch, Path(tmp))
        first = trainer.train_step()
        for _ in range(max(0, args.warmup - 1)):
            trainer.train_step()
        sync(device)
        walls, seq0, resp0 = [], trainer.seq_tokens, trainer.tokens_seen
        for _ in range(args.steps):
            t0 = time.perf_counter()
            trainer.train_step()
            sync(device)
            walls.append(time.perf_counter() - t0)
        seq, resp = trainer.seq_tokens - seq0, trainer.tokens_seen - resp0
        parts: dict[str, list[float]] = {}
        for _ in range(args.steps):
            marks = Marks(device)
            marks.mark("start")
            batch_out = trainer.next_target_batch()
            marks.mark("target forward")
            factor = trainer.lr_scale()
            for name in list(trainer.objectives):
                trainer.objective_step(name, batch_out, factor)
                marks.mark(name)
            for label, ms in marks.spans_ms().items():
                parts.setdefault(label, []).append(ms)
        del trainer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    wall = sum(walls)
    return {"variant": f"{autocast}/{batch}" + ("/chain" if kl == "chain" else ""), "autocast": autocast,
            "batch": batch, "kl": kl,
            "step_ms": round(1e3 * statistics.median(walls), 2), "seq_tok_s": round(seq / wall, 1),
            "resp_tok_s": round(resp / wall, 1),
            "parts_ms": {k: round(statistics.median(v), 2) for k, v in parts.items()},
            "first_losses": {k: v for k, v in first.items() if k.endswith("/loss")}}


def choose(rows: list[dict[str, Any]], tol: float, min_gain: float) -> tuple[str, int]:
    """(autocast, batch) for training: the first variant's batch, and bf16 autocast for each head whose
    part under the bf16 variant at that batch is faster by more than `min_gain` (relative), if that
    variant kept every first-step loss within `tol` (relative) of the first variant's; marks `losses_close`
    on the rows of the first variant's batch size."""
    base = rows[0]
    heads: list[str] = []
    for r in rows[1:]:
        if r["batch"] != base["batch"]:
            continue
        r["losses_close"] = all(abs(r["first_losses"][k] - v) <= tol * abs(v) for k, v in base["first_losses"].items())
        same_kl = r.get("kl", "fused") == base.get("kl", "fused")  # a /chain row is a check, not a choice
        if same_kl and r["autocast"] == "bf16" and base["autocast"] == "none" and r["losses_close"]:
            heads = [k for k in base["parts_ms"] if k != "target forward"
                     and r["parts_ms"][k] < (1.0 - min_gain) * base["parts_ms"][k]]
    names = [k for k in base["parts_ms"] if k != "target forward"]
    autocast = base["autocast"] if not heads else "bf16" if heads == names else ",".join(heads)
    return autocast, base["batch"]


def profile_steps(args: argparse.Namespace, target: Any, store: Any, autocast: str, batch: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    device = target.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(args, target, store, autocast, batch, Path(tmp))
        for _ in range(max(1, args.warmup)):
            trainer.train_step()
        sync(device)
        t0 = time.perf_counter()
        with profile(activities=activities) as prof:
            for _ in range(args.profile_steps):
                trainer.train_step()
            sync(device)
        wall_us = 1e6 * (time.perf_counter() - t0)
    averages = prof.key_averages()
    lines = [f"profile of {args.profile_steps} step(s), variant {autocast}/{batch}, wall {wall_us / 1e3:.1f} ms"]
    if device.type == "cuda":
        def self_device_us(a: Any) -> float:
            return float(getattr(a, "self_device_time_total", getattr(a, "self_cuda_time_total", 0.0)))

        from torch.autograd import DeviceType

        busy = sum(self_device_us(a) for a in averages if a.device_type != DeviceType.CPU)  # the kernels themselves
        lines.append(f"device busy {busy / 1e3:.1f} ms = {busy / wall_us:.2f} of the wall time")
        sort = "self_device_time_total" if hasattr(averages[0], "self_device_time_total") else "self_cuda_time_total"
    else:
        sort = "self_cpu_time_total"
    sdpa = {a.key: a.count for a in averages if "scaled_dot_product" in a.key or "attention" in a.key.lower()}
    lines.append("attention ops (calls): " + ", ".join(f"{k} {v}" for k, v in sorted(sdpa.items())))  # which SDPA backend
    lines.append(averages.table(sort_by=sort, row_limit=args.profile_rows, max_name_column_width=70))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, help="target name (default smollm2-135m or $SPECBENCH_TARGET)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="target dtype (default bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--heads", default="dflash,jetspec,jetspec-tree,eagle3,jetspec++")
    p.add_argument("--head-arg", action="append", default=[], metavar="[LABEL:]KEY=VALUE")
    p.add_argument("--corpus", default=None, help="time on this corpus's training sequences")
    p.add_argument("--synthetic", type=int, default=0, help="time on N random sequences instead of --corpus")
    p.add_argument("--variants", default="none/16,bf16/16", help="AUTOCAST/BATCH items, the first the baseline")
    p.add_argument("--max-len", type=int, default=640)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--loss-tol", type=float, default=0.02, help="--choose: first-step losses within this (relative)")
    p.add_argument("--min-gain", type=float, default=0.05, help="--choose: another variant must beat the first by this")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-steps", type=int, default=2)
    p.add_argument("--profile-rows", type=int, default=30)
    p.add_argument("--json", default=None)
    p.add_argument("--choose", default=None)
    args = p.parse_args()
    variants = parse_variants(args.variants)
    if bool(args.corpus) == bool(args.synthetic):
        raise ValueError("give one of --corpus DIR and --synthetic N")
    if args.steps < 1 or args.warmup < 1:
        raise ValueError("--steps and --warmup must be >= 1")

    from specbench.models import load_target

    if args.device.startswith("cuda"):  # as `specbench train` runs: fp32 matmuls on TF32 tensor cores
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    target = load_target(args.target, device=args.device, dtype=dtype)
    if args.corpus:
        from specbench.train import corpus as corpus_mod

        corpus = corpus_mod.Corpus.open(args.corpus)
        store, plan_index, _ = corpus_mod.load(corpus, None)
        train, _ = corpus_mod.split_validation(store, plan_index, 64, corpus.spec.greedy_variant)  # as `specbench train`
        store = train if len(train) else store  # a corpus of fewer prompts (a rehearsal): time on all of it
    else:
        store = synthetic_store(target.config.vocab_size, args.synthetic)
    lengths = store.response_lengths().float()
    print(f"bench_train_step: {len(store)} sequences, mean response {lengths.mean():.0f} tokens; heads {args.heads}; "
          f"{args.device} {dtype}", file=sys.stderr)
    def timed(autocast: str, batch: int, kl: str = "fused") -> dict[str, Any]:
        row = time_variant(args, target, store, autocast, batch, kl)
        parts = ", ".join(f"{k} {v:.1f}" for k, v in row["parts_ms"].items())
        print(f"{row['variant']:>10}: {row['step_ms']:8.1f} ms/step, {row['seq_tok_s']:>9,.0f} seq tok/s, "
              f"{row['resp_tok_s']:>9,.0f} response tok/s | ms: {parts}")
        return row

    rows = [timed(*variant) for variant in variants]
    autocast, batch = choose(rows, args.loss_tol, args.min_gain)
    kl = rows[0]["kl"]
    if (autocast, batch, kl) not in {(r["autocast"], r["batch"], r["kl"]) for r in rows}:  # some heads only: time it too
        rows.append(timed(autocast, batch, kl))
    best = next(r for r in rows if (r["autocast"], r["batch"], r["kl"]) == (autocast, batch, kl))
    for r in rows[1:]:
        if "losses_close" in r:
            diffs = ", ".join(f"{k.split('/')[0]} {(r['first_losses'][k] - v) / max(abs(v), 1e-12):+.4f}"
                              for k, v in rows[0]["first_losses"].items())
            print(f"{r['variant']:>10}: first-step losses vs {rows[0]['variant']}: {diffs} "
                  f"({'within' if r['losses_close'] else 'outside'} {args.loss_tol:g})")
    print(f"chosen: {best['variant']} ({best['resp_tok_s']:,.0f} response tok/s)")
    if args.choose:
        Path(args.choose).write_text(f"{autocast} {batch}\n")
    report: dict[str, Any] = {"device": args.device, "dtype": dtype, "heads": args.heads, "max_len": args.max_len,
                              "sequences": len(store), "variants": rows, "chosen": best["variant"]}
    if args.device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name()
    if args.profile:
        text = profile_steps(args, target, store, best["autocast"], best["batch"])
        print(text)
        report["profile"] = text
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as exc:
        print(f"bench_train_step: error: {exc}", file=sys.stderr)
        sys.exit(2)
