"""`specbench train`: regenerate responses with the target, then train one or more heads together.

    specbench train --drafter dflash,jetspec,jetspec-tree --target smollm2-135m --data DATA_DIR --out runs/heads
    python -m specbench.train.cli train ...            (the same, without the specbench entry point)

Interrupt and rerun the same command to resume: regenerated sequences are cached under OUT/data,
the trainer state under OUT/trainer_state.pt; finished heads are written to OUT/heads/<name>/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from specbench.config import parse_value

DEFAULT_SETS = "gsm8k_train,mbpp_train,sharegpt"


def add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", required=True, help="comma-separated heads to train together, e.g. dflash,jetspec,jetspec-tree")
    p.add_argument("--target", default=None, help="target name (default smollm2-135m or $SPECBENCH_TARGET)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="target dtype (default: float32 on cpu, bfloat16 on cuda); heads train in fp32")
    p.add_argument("--data", default=None, help="directory with the training prompt files (default $SPECBENCH_DATA)")
    p.add_argument("--sets", default=DEFAULT_SETS, help=f"training prompt sets (default {DEFAULT_SETS})")
    p.add_argument("--synthetic-prompts", type=int, default=0,
                   help="use N random token-id prompts instead of --data (tokenizer-less random targets)")
    p.add_argument("--out", required=True, help="output directory (resumes if it holds a run)")
    p.add_argument("--max-prompts", type=int, default=None, help="use at most N training prompts")
    p.add_argument("--max-prompt-len", type=int, default=384, help="skip prompts longer than this (tokens)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="response length cap when regenerating")
    p.add_argument("--gen-batch", type=int, default=64, help="prompts per generation batch")
    p.add_argument("--gen-temperature", type=float, default=0.0, help="0 = greedy responses")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: fill the time budget, else 1000)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per training step")
    p.add_argument("--max-len", type=int, default=1024, help="cut training sequences to this many tokens")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=200)
    p.add_argument("--minutes", type=float, default=None, help="wall-clock budget for the whole run")
    p.add_argument("--gen-minutes", type=float, default=None, help="wall-clock budget for regeneration")
    p.add_argument("--head-arg", action="append", metavar="[NAME:]KEY=VALUE",
                   help="objective setting for every head (or only NAME), e.g. block_size=16, jetspec:losses={fkl: 1}")
    p.add_argument("--no-int8", action="store_true", help="store exported heads in fp32 instead of int8")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def parse_head_args(items: Sequence[str] | None, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """["block_size=8", "jetspec:anchors=4"] -> {name: {key: value}} (unprefixed keys go to every head)."""
    out: dict[str, dict[str, Any]] = {n: {} for n in names}
    for item in items or ():
        if "=" not in item:
            raise ValueError(f"--head-arg takes [NAME:]KEY=VALUE, got {item!r}")
        key, _, raw = item.partition("=")
        owner, _, key = key.rpartition(":")
        if owner and owner not in out:
            raise ValueError(f"--head-arg {item!r} names {owner!r}, which is not among the heads trained ({', '.join(names)})")
        for n in ([owner] if owner else names):
            out[n][key.strip()] = parse_value(raw)
    return out


def build_objectives(target: Any, names: Sequence[str], settings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from specbench.train import OBJECTIVES

    return {n: OBJECTIVES.build(n, target, **settings.get(n, {})) for n in names}


def load_prompts(args: argparse.Namespace, target: Any) -> list[list[int]]:
    from specbench.train.regen import synthetic_prompt_ids, training_prompt_ids

    if args.synthetic_prompts:
        return synthetic_prompt_ids(target.config.vocab_size, args.synthetic_prompts, 4, min(args.max_prompt_len, 48), args.seed)
    sets = [s for s in args.sets.split(",") if s]
    return training_prompt_ids(target, args.data, sets, max_prompt_len=args.max_prompt_len, limit=args.max_prompts,
                               seed=args.seed)


def check_before_loading(args: argparse.Namespace, names: Sequence[str]) -> None:
    """What needs no model: the heads are trainable and the training prompts can be found."""
    from specbench.data import TRAINING_SETS, resolve_data_dir
    from specbench.train import OBJECTIVES

    if not names:
        raise ValueError("--drafter names no head to train (e.g. --drafter dflash,jetspec)")
    for name in names:
        if name not in OBJECTIVES and ":" not in name:  # (a dotted path is imported later)
            raise ValueError(f"--drafter {name}: no training objective of that name; trainable heads: "
                             f"{', '.join(OBJECTIVES.names())}")
    if args.synthetic_prompts:
        return
    sets = [s for s in args.sets.split(",") if s]
    unknown = [s for s in sets if s not in TRAINING_SETS]
    if unknown or not sets:
        raise ValueError(f"--sets {args.sets}: training sets are {', '.join(TRAINING_SETS)}")
    resolve_data_dir(args.data, f"the training prompts ({', '.join(sets)})")


def cmd_train(args: argparse.Namespace) -> int:
    from specbench.models import load_target
    from specbench.train.regen import regenerate
    from specbench.train.trainer import TrainConfig, Trainer

    start = time.monotonic()
    deadline = start + 60 * args.minutes if args.minutes else None
    names = [n.strip() for n in args.drafter.split(",") if n.strip()]
    settings = parse_head_args(args.head_arg, names)
    check_before_loading(args, names)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    target = load_target(args.target, device=args.device, dtype=dtype)
    objectives = build_objectives(target, names, settings)  # fail on bad settings before generating
    out = Path(args.out)
    prompts = load_prompts(args, target)
    gen_deadline = start + 60 * args.gen_minutes if args.gen_minutes else deadline
    sequences = regenerate(target, prompts, out / "data", max_new_tokens=args.max_new_tokens, batch_size=args.gen_batch,
                           temperature=args.gen_temperature, seed=args.seed, deadline=gen_deadline, progress=not args.quiet)
    print(f"specbench train: {len(sequences)} regenerated sequences in {out / 'data'}", file=sys.stderr)
    config = TrainConfig(batch_size=args.batch_size, max_len=args.max_len, steps=args.steps or 1000, lr=args.lr,
                         seed=args.seed, save_every=args.save_every)
    trainer = Trainer(target, objectives, sequences, config, out)
    if trainer.load_state():
        print(f"specbench train: resumed at step {trainer.step}", file=sys.stderr)
    elif args.steps is None and deadline is not None:
        fit_steps_to_deadline(trainer, deadline, progress=not args.quiet)
    trainer.train(deadline=deadline, progress=not args.quiet)
    heads = trainer.export_heads(out / "heads", int8=not args.no_int8)
    for name, d in heads.items():
        print(f"specbench train: {name} head -> {d}  (use --drafter {name} --drafter-arg checkpoint={d})")
    return 0


def fit_steps_to_deadline(trainer: Any, deadline: float, calibration_steps: int = 3, reserve_s: float = 15.0,
                          progress: bool = True) -> None:
    """Time a few steps, then set the schedule length to what fits before `deadline`."""
    trainer.total_steps = 1_000_000  # provisional: the calibration steps run at warmup LR
    trainer.train_step()  # untimed: the first step pays one-off costs (allocator, kernel selection)
    t0 = time.monotonic()
    for _ in range(calibration_steps):
        trainer.train_step()
    per_step = (time.monotonic() - t0) / calibration_steps
    left = deadline - time.monotonic() - reserve_s
    trainer.total_steps = trainer.step + max(1, int(left / per_step))
    if progress:
        print(f"specbench train: {per_step:.3f} s/step -> schedule of {trainer.total_steps} steps", file=sys.stderr)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("train", help="train draft heads (dflash, jetspec, jetspec-tree, ...) on a frozen target")
    add_train_args(p)
    p.set_defaults(func=cmd_train)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specbench.train.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
