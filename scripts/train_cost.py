"""What a training run at scale costs: FLOPs of one training step (target forward + every head's loss,
backward), counted by torch's FlopCounterMode on a real batch of the target, and what that means per
epoch of a corpus. Counted on a small batch and scaled linearly to --batch-size (every term of a step is
linear in the sequences of the batch).

    python scripts/train_cost.py --corpus CORPUS [--heads dflash,jetspec,jetspec-tree,eagle3] [--batch-size 16]
    python scripts/train_cost.py --seq-len 450 --response-len 360 --sequences 64000   # without a corpus

The GPU time is an estimate at an assumed achieved rate (--tflops, default 100: tensor-core work at
bf16/TF32 on an H200 runs near 790 TFLOP/s peak, these small matrices far below it); the first real call
logs the measured tok_s, which replaces this guess.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch.utils.flop_counter import FlopCounterMode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--heads", default="dflash,jetspec,jetspec-tree,eagle3")
    p.add_argument("--head-arg", action="append", default=[], metavar="[LABEL:]KEY=VALUE")
    p.add_argument("--corpus", default=None, help="take the sequence count and lengths from this corpus")
    p.add_argument("--seq-len", type=int, default=450, help="mean sequence length (prompt + response), without --corpus")
    p.add_argument("--response-len", type=int, default=360, help="mean response length, without --corpus")
    p.add_argument("--sequences", type=int, default=64000, help="training sequences, without --corpus")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--count-batch", type=int, default=2, help="sequences in the batch actually counted")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--tflops", type=float, default=100.0, help="assumed achieved TFLOP/s on the GPU")
    args = p.parse_args()

    from specbench.models import load_target
    from specbench.train.cli import build_objectives, parse_drafters, parse_head_args
    from specbench.train.objective import TargetBatch
    from specbench.train.trainer import target_batch

    torch.set_grad_enabled(True)
    target = load_target(args.target)
    seq_len, resp_len, sequences = args.seq_len, args.response_len, args.sequences
    if args.corpus:
        from specbench.train.corpus import Corpus, status

        st = status(Corpus.open(args.corpus))
        sequences = st["sequences"]
        seq_len = round(st["sequence_tokens"] / sequences)
        resp_len = round(st["response_tokens"] / sequences)
    labels = parse_drafters(args.heads)
    objectives = build_objectives(target, labels, parse_head_args(args.head_arg, list(labels)))
    for obj in objectives.values():
        obj.prepare(torch.ones(target.config.vocab_size, dtype=torch.long))
    b, t = args.count_batch, seq_len
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(target.config.vocab_size, (b, t), generator=g)
    valid = torch.ones(b, t, dtype=torch.bool)
    loss_mask = torch.zeros(b, t, dtype=torch.bool)
    loss_mask[:, t - resp_len:] = True
    taps = tuple(sorted({x for o in objectives.values() for x in o.taps}))
    counts: dict[str, float] = {}
    times: dict[str, float] = {}
    t0 = time.monotonic()
    with FlopCounterMode(display=False) as fc:
        batch = target_batch(target, tokens, valid, loss_mask, taps)
    counts["target forward"], times["target forward"] = fc.get_total_flops(), time.monotonic() - t0
    batch = TargetBatch(batch.tokens, batch.valid, batch.loss_mask, {k: v.clone() for k, v in batch.hidden.items()},
                        batch.target_logits.clone())
    for name, obj in objectives.items():
        t0 = time.monotonic()
        with FlopCounterMode(display=False) as fc:
            loss, _ = obj.loss(batch, torch.Generator().manual_seed(1))
            loss.backward()
        counts[name], times[name] = fc.get_total_flops(), time.monotonic() - t0
    scale = args.batch_size / b
    steps = args.epochs * sequences / args.batch_size
    total = sum(counts.values()) * scale
    print(f"batch {args.batch_size} x {seq_len} tokens ({resp_len} response), {sequences:,} sequences, "
          f"{args.epochs:g} epoch(s) = {steps:,.0f} steps")
    print(f"{'part':<16}{'GFLOP/step':>12}{'CPU s (counted batch)':>23}")
    for name, c in counts.items():
        print(f"{name:<16}{c * scale / 1e9:>12.0f}{times[name]:>23.1f}")
    print(f"{'total':<16}{total / 1e9:>12.0f}")
    cpu_s = sum(times.values()) * scale
    print(f"CPU here (this run, shared 2 cores, fp32): {cpu_s:.0f} s/step = {total / cpu_s / 1e9:.1f} GFLOP/s measured; "
          f"{steps * cpu_s / 3600:,.0f} h for the run")
    gpu_s = total / (args.tflops * 1e12)
    print(f"GPU at an assumed {args.tflops:g} TFLOP/s: {1e3 * gpu_s:.0f} ms/step, "
          f"{args.batch_size * resp_len / gpu_s:,.0f} response tok/s, {steps * gpu_s / 60:,.0f} min for the run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
