"""Train the draft heads for a target in ONE command on the GPU machine, within a wall-clock budget.

    SPECBENCH_CACHE=/tmp/sbc PYTHONPATH=/root/site:$PWD python scripts/train_heads_gpu.py \
        --target gguf:/root/stage/smollm2.gguf --target-name smollm2-135m --data DATA_DIR \
        --heads dflash,jetspec,jetspec-tree,eagle3 --minutes 7.5 --out $OUT

Steps: load the target (bf16) -> answer the training prompts with it (batched greedy, until
--gen-minutes after the start) -> train every requested head together (one target forward per
batch) until --minutes after the start minus a reserve -> export each head as int8 (what ships) and
bf16 (to measure what int8 costs) into one tar per head under $OUT, plus the training log and a
summary. Dry run on the CPU (tiny random target, synthetic prompts, tiny heads):

    python scripts/train_heads_gpu.py --device cpu --target random:tiny-llama --dry-run --out /tmp/dry
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

MAX_FILE_BYTES = 16 * 1024 * 1024


def log(msg: str, start: float) -> None:
    print(f"[{time.monotonic() - start:6.1f}s] {msg}", flush=True)


def available_objectives(names: list[str], start: float) -> list[str]:
    """The requested heads whose objective is registered and importable (others skipped, said why)."""
    from specbench.train import OBJECTIVES

    keep = []
    for name in names:
        if name not in OBJECTIVES:
            log(f"SKIP {name}: no training objective is registered under that name "
                f"(registered: {', '.join(OBJECTIVES.names())})", start)
            continue
        try:
            OBJECTIVES.get(name)
        except (ImportError, AttributeError) as exc:
            log(f"SKIP {name}: its objective does not import ({exc})", start)
            continue
        keep.append(name)
    return keep


def tar_head(out: Path, name: str, dirs: dict[str, Path]) -> Path:
    """One <name>.tar holding <name>/int8/ and <name>/bf16/ (bf16 dropped if over the file limit)."""
    path = out / f"{name}.tar"
    for parts in (dirs, {k: v for k, v in dirs.items() if k == "int8"}):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for kind, d in parts.items():
                tar.add(str(d), arcname=f"{name}/{kind}")
        if buf.tell() <= MAX_FILE_BYTES:
            path.write_bytes(buf.getvalue())
            return path
    raise RuntimeError(f"the int8 {name} head is larger than {MAX_FILE_BYTES} bytes")


def preflight(trainer, start: float) -> None:  # type: ignore[no-untyped-def]
    """One loss + backward per objective on a real batch; drop (and say) any that fails, so that one
    broken objective cannot end the run for the others."""
    from specbench.train.trainer import SequenceBatches, target_batch

    cfg, target = trainer.config, trainer.target
    data = SequenceBatches(trainer.store, cfg.batch_size, cfg.max_len, cfg.seed + 1)
    tokens, valid, loss_mask = data.collate(data.next(), target.device)
    batch = target_batch(target, tokens, valid, loss_mask, trainer.taps)
    for name in list(trainer.objectives):
        obj = trainer.objectives[name]
        try:
            loss, _ = obj.loss(batch, torch.Generator().manual_seed(0))
            loss.backward()
            obj.head.zero_grad(set_to_none=True)
        except Exception as exc:
            log(f"SKIP {name}: its first training step failed: {type(exc).__name__}: {exc}", start)
            trainer.drop(name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--target-name", default=None, help="name the heads record (default: the target spec)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--data", default=None, help="directory with gsm8k_train.jsonl, mbpp.jsonl, sharegpt_prompts.jsonl")
    p.add_argument("--heads", default="dflash,jetspec,jetspec-tree,eagle3")
    p.add_argument("--out", default=os.environ.get("OUT"), help="results directory (default $OUT)")
    p.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    p.add_argument("--minutes", type=float, default=7.5, help="wall-clock budget of the whole command")
    p.add_argument("--gen-minutes", type=float, default=3.0, help="stop regenerating this long after the start")
    p.add_argument("--reserve-s", type=float, default=25.0, help="seconds kept for export after training")
    p.add_argument("--max-prompts", type=int, default=12000)
    p.add_argument("--max-prompt-len", type=int, default=384)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--gen-batch", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--anchors", type=int, default=32)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--num-taps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="tiny everything (CPU check of this script)")
    args = p.parse_args()
    start = time.monotonic()
    if not args.out:
        p.error("--out (or $OUT) is required")
    os.environ.setdefault("SPECBENCH_CACHE", str(Path(tempfile.gettempdir()) / "specbench_cache"))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    from specbench.models import load_target
    from specbench.train.cli import fit_steps_to_deadline
    from specbench.train.regen import regenerate, synthetic_prompt_ids, training_prompt_ids
    from specbench.train.trainer import LOG_FILE, TrainConfig, Trainer
    from specbench.train import OBJECTIVES

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="heads_"))
    deadline = start + 60 * args.minutes
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    target = load_target(args.target, device=args.device, dtype=dtype)
    if args.target_name:
        target.name = args.target_name
    from specbench.drafters.heads.checkpoint import save_head

    identity = target.fingerprint
    log(f"target {args.target} ({target.config.num_layers} layers, vocab {target.config.vocab_size}) on {args.device} "
        f"{dtype}; fingerprint {identity} (heads load only where load_target gives the same)", start)

    names = available_objectives([h.strip() for h in args.heads.split(",") if h.strip()], start)
    if not names:
        log("nothing to train", start)
        return 2
    block = {"num_layers": args.layers, "num_taps": args.num_taps, "block_size": args.block_size, "anchors": args.anchors}
    if args.dry_run:
        block.update(block_size=4, anchors=4)
    objectives = {}
    for name in names:
        settings = block if name in ("dflash", "jetspec", "jetspec-tree") else {}
        if name == "eagle3" and args.dry_run:
            settings = {"draft_vocab": min(4096, target.config.vocab_size)}
        try:
            objectives[name] = OBJECTIVES.build(name, target, **settings)
        except Exception as exc:  # one broken objective must not cost the other heads their run
            log(f"SKIP {name}: building its objective failed: {type(exc).__name__}: {exc}", start)
            continue
        n_params = sum(p.numel() for p in objectives[name].head.parameters())
        log(f"{name}: {n_params / 1e6:.2f}M trainable parameters, taps {tuple(objectives[name].taps)}", start)

    if target.tokenizer is None:
        prompts = synthetic_prompt_ids(target.config.vocab_size, 24, 4, 16, args.seed)
    else:
        prompts = training_prompt_ids(target, args.data, ["gsm8k_train", "mbpp_train", "sharegpt"],
                                      max_prompt_len=args.max_prompt_len,
                                      limit=12 if args.dry_run else args.max_prompts, seed=args.seed)
    max_new = 16 if args.dry_run else args.max_new_tokens
    log(f"{len(prompts)} training prompts; regenerating until {args.gen_minutes:.1f} min", start)
    gen_batch = 8 if args.dry_run else args.gen_batch
    sequences = regenerate(target, prompts, work / "data", max_new_tokens=max_new, batch_size=gen_batch,
                           deadline=start + 60 * args.gen_minutes, seed=args.seed, progress=False)
    n_tokens = sum(len(s.response) for s in sequences)
    log(f"regenerated {len(sequences)} sequences ({n_tokens} response tokens)", start)

    config = TrainConfig(batch_size=4 if args.dry_run else args.batch_size, max_len=args.max_prompt_len + max_new,
                         lr=args.lr, seed=args.seed, save_every=0, steps=6 if args.dry_run else 1000)
    trainer = Trainer(target, objectives, sequences, config, work / "run")
    preflight(trainer, start)
    names = list(trainer.objectives)
    if not names:
        log("every objective failed its first step", start)
        return 2
    train_deadline = deadline - args.reserve_s
    if not args.dry_run:
        fit_steps_to_deadline(trainer, train_deadline, progress=False)
    log(f"training {', '.join(names)}: schedule {trainer.total_steps} steps", start)
    while trainer.step < trainer.total_steps and time.monotonic() < train_deadline:
        t_chunk, s_chunk = time.monotonic(), trainer.step
        trainer.train(steps=trainer.step + (2 if args.dry_run else 50), deadline=train_deadline, progress=False,
                      checkpoint=False)
        if not args.dry_run and trainer.step > s_chunk:  # re-fit the schedule to the measured speed
            per_step = (time.monotonic() - t_chunk) / (trainer.step - s_chunk)
            trainer.total_steps = trainer.step + max(0, int((train_deadline - time.monotonic()) / per_step))
        rows = [json.loads(line) for line in (work / "run" / LOG_FILE).read_text().splitlines()[-1:]]
        if rows:
            last = rows[-1]
            parts = "  ".join(f"{n} {last.get(f'{n}/loss', float('nan')):.3f}" for n in names)
            log(f"step {trainer.step}/{trainer.total_steps}  loss: {parts}", start)

    summary = {"target": args.target, "target_name": target.name, "target_fingerprint": identity, "heads": {},
               "sequences": len(sequences), "response_tokens": n_tokens, "steps": trainer.step, "schedule_steps": trainer.total_steps,
               "config": vars(args)}
    log_rows = [json.loads(line) for line in (work / "run" / LOG_FILE).read_text().splitlines()]
    for name, obj in trainer.objectives.items():
        dirs = {}
        for kind, int8, fdt in (("int8", True, torch.float32), ("bf16", False, torch.bfloat16)):
            d = work / "export" / name / kind
            save_head(d, obj.head, obj.head_config(), target, storage="int8" if int8 else "fp32", float_dtype=fdt)
            dirs[kind] = d
        tar = tar_head(out, name, dirs)
        tail = [r for r in log_rows[-5:] if f"{name}/loss" in r]
        mean = lambda key: sum(r.get(key, float("nan")) for r in tail) / max(1, len(tail))  # noqa: E731
        summary["heads"][name] = {"tar": tar.name, "tar_bytes": tar.stat().st_size,
                                  "int8_bytes": (dirs["int8"] / "head.safetensors").stat().st_size,
                                  "loss": mean(f"{name}/loss"), "acc": mean(f"{name}/acc"),
                                  "acc_next": mean(f"{name}/acc_next")}
    (out / "train_log.jsonl").write_text((work / "run" / LOG_FILE).read_text())
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    log("done", start)
    print(f"\n{'head':<14}{'steps':>7}{'loss':>9}{'acc':>8}{'acc_next':>10}{'int8 MB':>9}{'tar MB':>8}")
    for name, h in summary["heads"].items():
        print(f"{name:<14}{trainer.step:>7}{h['loss']:>9.3f}{h['acc']:>8.3f}{h['acc_next']:>10.3f}"
              f"{h['int8_bytes'] / 2**20:>9.2f}{h['tar_bytes'] / 2**20:>8.2f}")
    print(f"sequences {len(sequences)}  response tokens {n_tokens}  target fingerprint {identity}  "
          f"wall {time.monotonic() - start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
