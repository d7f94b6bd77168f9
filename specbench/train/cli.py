"""`specbench train`: train one or more heads together on a frozen target.

    specbench train --drafter dflash,jetspec,jetspec-tree --data DATA_DIR --out runs/heads      # small run
    specbench train --drafter dflash,jetspec,jetspec-tree,eagle3 --corpus CORPUS --epochs 3 --out RUN  # at scale
    specbench train --drafter dflash,jetspec --grid num_layers=2,3 --grid block_size=8 --corpus CORPUS --out RUN
    specbench train-report RUN                        # summary (has the validation loss flattened?) + PNG per head
    python -m specbench.train.cli train ...           (the same, without the specbench entry point)

Data: without --corpus the responses are regenerated into OUT/data (greedy, resumable); with --corpus
(made by `specbench corpus generate`) its finished shards are read, the first --val-prompts plan
prompts held out for validation. Interrupt and rerun the same command to resume (OUT/trainer_state.pt;
--minutes / --until-step bound one call, the schedule length stays what the run started with unless
--reschedule). Heads are exported to OUT/heads/<label>/ at the end of every call, snapshots at
--snapshot-tokens to OUT/snapshots/, plots to OUT/plots/.

Heads: `--drafter` entries are objective names or LABEL=OBJECTIVE (several heads of one objective);
`--head-arg [LABEL:]KEY=VALUE` sets an objective option; `--grid [LABEL:]KEY=V1,V2` adds one head per
value beside each head (one factor at a time), labelled <label>-<key><value>; `--init-heads DIR` starts a
fresh run's heads from trained checkpoints (e.g. specbench/heads: the shipped heads trained on); with
`--head-arg num_layers=N` above the checkpoint's, a draft head grows, its added layers starting as identity maps.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from specbench.config import parse_value

DEFAULT_SETS = "gsm8k_train,mbpp_train,sharegpt"
RUN_FILE = "run.json"


def parse_token_count(text: str) -> int:
    """"0.4M" -> 400000, "250k" -> 250000, "1e6" -> 1000000."""
    t = text.strip()
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}.get(t[-1:].lower(), 1.0)
    try:
        return int(round(float(t[:-1] if scale != 1.0 else t) * scale))
    except ValueError:
        raise ValueError(f"--snapshot-tokens takes counts like 0.4M,2M,250k; got {text!r}") from None


def add_train_args(p: argparse.ArgumentParser) -> None:
    from specbench.drafters.heads.checkpoint import STORAGE

    p.add_argument("--drafter", required=True,
                   help="comma-separated heads to train together: objective names or LABEL=OBJECTIVE, e.g. dflash,jetspec-tree")
    p.add_argument("--target", default=None, help="target name (default smollm2-135m or $SPECBENCH_TARGET)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="target dtype (default: float32 on cpu, bfloat16 on cuda); heads train in fp32")
    p.add_argument("--out", required=True, help="run directory (resumes if it holds a run)")
    g = p.add_argument_group("data")
    g.add_argument("--corpus", default=None, help="a corpus directory (specbench corpus generate) instead of regenerating")
    g.add_argument("--refresh-data", action="store_true",
                   help="resume on the corpus's current shards although they changed (a new epoch starts)")
    g.add_argument("--val-prompts", type=int, default=None,
                   help="prompts held out for validation (default 64 with --corpus, else 0)")
    g.add_argument("--data", default=None, help="directory with the training prompt files (default $SPECBENCH_DATA)")
    g.add_argument("--sets", default=DEFAULT_SETS, help=f"training prompt sets when regenerating (default {DEFAULT_SETS})")
    g.add_argument("--synthetic-prompts", type=int, default=0,
                   help="use N random token-id prompts instead of --data (tokenizer-less random targets)")
    g.add_argument("--max-prompts", type=int, default=None, help="use at most N training prompts (regenerating)")
    g.add_argument("--max-prompt-len", type=int, default=384, help="skip prompts longer than this (tokens)")
    g.add_argument("--max-new-tokens", type=int, default=256, help="response length cap when regenerating")
    g.add_argument("--gen-batch", type=int, default=64, help="prompts per generation batch")
    g.add_argument("--gen-temperature", type=float, default=0.0, help="0 = greedy responses")
    g.add_argument("--gen-minutes", type=float, default=None, help="wall-clock budget for regeneration")
    s = p.add_argument_group("schedule")
    s.add_argument("--steps", type=int, default=None, help="schedule length in steps (default: --epochs, else fill "
                                                            "the time budget, else 1000)")
    s.add_argument("--epochs", type=float, default=None, help="schedule length in passes over the training sequences")
    s.add_argument("--reschedule", action="store_true", help="change a resumed run's schedule length to --steps/--epochs")
    s.add_argument("--until-step", type=int, default=None, help="stop this call at this step (the schedule is unchanged)")
    s.add_argument("--minutes", type=float, default=None, help="wall-clock budget for this call")
    s.add_argument("--schedule", default="cosine", choices=["cosine", "wsd"],
                   help="after the warm-up: cosine decay, or constant then linear decay over --decay-frac (wsd)")
    s.add_argument("--warmup-frac", type=float, default=0.04)
    s.add_argument("--min-lr-frac", type=float, default=0.1)
    s.add_argument("--decay-frac", type=float, default=0.2)
    s.add_argument("--batch-size", type=int, default=8, help="sequences per training step")
    s.add_argument("--max-len", type=int, default=1024, help="cut training sequences to this many tokens")
    s.add_argument("--lr", type=float, default=6e-4)
    s.add_argument("--weight-decay", type=float, default=0.0)
    s.add_argument("--grad-clip", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=0)
    h = p.add_argument_group("heads")
    h.add_argument("--head-arg", action="append", metavar="[LABEL:]KEY=VALUE",
                   help="objective setting for every head (or only LABEL), e.g. block_size=16, jetspec:losses={fkl: 1}")
    h.add_argument("--grid", action="append", metavar="[LABEL:]KEY=V1,V2",
                   help="ablation: one more head per value beside each head (or only LABEL), e.g. num_layers=2,3")
    h.add_argument("--head-storage", choices=STORAGE, default="int8",
                   help="how exported heads store their 2-D weights: int8 per-row, int4 per group of 64 columns "
                        "(half the bytes), or fp32")
    h.add_argument("--init-heads", default=None, metavar="DIR",
                   help="a fresh run starts each head from the checkpoint DIR/LABEL or DIR/<drafter>-<target> (e.g. "
                        "specbench/heads: train the shipped heads on); weights only, the optimizer and schedule start anew; a draft "
                        "head with fewer layers than --head-arg num_layers grows (its added layers start as identity maps)")
    h.add_argument("--no-tf32", action="store_true", help="on CUDA, keep the heads' fp32 matmuls off TF32 tensor cores")
    h.add_argument("--autocast", default="none", metavar="none|bf16|LABEL,...",
                   help="run the heads' training forward under bf16 autocast: none, bf16 (every head) or these heads "
                        "(fp32 weights, optimizer and losses; validation stays without it); scripts/bench_train_step.py "
                        "times each head both ways")
    v = p.add_argument_group("validation, snapshots, checkpoints")
    v.add_argument("--val-every", type=int, default=200, help="steps between validation losses (0 = none)")
    v.add_argument("--val-tau-every", type=int, default=1000, help="steps between validation tau by replay (0 = none)")
    v.add_argument("--val-sequences", type=int, default=256, help="validation sequences scored for the loss")
    v.add_argument("--val-tau-prompts", type=int, default=8, help="validation prompts replayed for tau")
    v.add_argument("--val-tau-budgets", default="16,64")
    v.add_argument("--val-max-new-tokens", type=int, default=128, help="length of the replayed continuations")
    v.add_argument("--snapshot-tokens", default="", help="export the heads at these response-token counts, e.g. 0.4M,2M")
    v.add_argument("--save-every", type=int, default=200)
    v.add_argument("--log-every", type=int, default=10)
    v.add_argument("--no-plot", action="store_true", help="skip the training-curve PNGs")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def parse_drafters(text: str) -> dict[str, str]:
    """"dflash,deep=dflash" -> {"dflash": "dflash", "deep": "dflash"} (label -> objective)."""
    out: dict[str, str] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        label, _, objective = item.rpartition("=") if "=" in item else (item, "", item)
        label, objective = label.strip(), objective.strip()
        if not re.fullmatch(r"[A-Za-z0-9._+-]+", label):
            raise ValueError(f"--drafter label {label!r}: use letters, digits and . _ + - only")
        if label in out:
            raise ValueError(f"--drafter names {label!r} twice: give each head its own LABEL=OBJECTIVE")
        out[label] = objective
    if not out:
        raise ValueError("--drafter names no head")
    return out


def _labelled(item: str, flag: str, form: str, labels: Sequence[str], among: str) -> tuple[str, str, str]:
    """"[LABEL:]KEY=RAW" -> (LABEL or "", KEY, RAW); a LABEL must be one of `labels`."""
    if "=" not in item:
        raise ValueError(f"{flag} takes {form}, got {item!r}")
    key, _, raw = item.partition("=")
    owner, _, key = key.rpartition(":")
    if owner and owner not in labels:
        raise ValueError(f"{flag} {item!r} names {owner!r}, which is not among {among} ({', '.join(labels)})")
    return owner, key, raw


def parse_head_args(items: Sequence[str] | None, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """["block_size=8", "jetspec:anchors=4"] -> {name: {key: value}} (unprefixed keys go to every head)."""
    out: dict[str, dict[str, Any]] = {n: {} for n in names}
    for item in items or ():
        owner, key, raw = _labelled(item, "--head-arg", "[NAME:]KEY=VALUE", names, "the heads trained")
        for n in ([owner] if owner else names):
            out[n][key.strip()] = parse_value(raw)
    return out


def _label_value(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", str(value)).strip("_")


def expand_grid(labels: dict[str, str], settings: dict[str, dict[str, Any]],
                grids: Sequence[str] | None) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """One head per grid value beside each base head (one factor at a time): <label>-<key><value>."""
    labels, settings = dict(labels), {k: dict(v) for k, v in settings.items()}
    base = list(labels)
    for item in grids or ():
        owner, key, raw = _labelled(item, "--grid", "[LABEL:]KEY=V1,V2,...", base, "the heads")
        values = [parse_value(v) for v in _split_values(raw)]
        for label in ([owner] if owner else base):
            for value in values:
                new = f"{label}-{key.strip()}{_label_value(value)}"
                labels[new] = labels[label]
                settings[new] = {**settings[label], key.strip(): value}
    return labels, settings


def _split_values(raw: str) -> list[str]:
    """Split on commas outside brackets: "1,2" -> [1, 2]; "[1,2],[3]" -> ["[1,2]", "[3]"]."""
    out, depth, cur = [], 0, ""
    for ch in raw:
        depth += ch in "[{("
        depth -= ch in "]})"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [v for v in out + [cur] if v.strip()]


def build_objectives(target: Any, labels: dict[str, str] | Sequence[str],
                     settings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """label -> objective (a sequence of names means label = objective name). Grid heads that
    repeat another head's configuration are dropped with a note."""
    from specbench.train import OBJECTIVES

    pairs = labels if isinstance(labels, dict) else {n: n for n in labels}
    out: dict[str, Any] = {}
    configs: dict[str, str] = {}
    for label, objective in pairs.items():
        try:
            obj = OBJECTIVES.build(objective, target, **settings.get(label, {}))
        except TypeError as exc:  # a setting this objective does not take (an unlabelled --head-arg reaches every head)
            raise ValueError(f"{exc}: change --head-arg (KEY=VALUE applies to every head; LABEL:KEY=VALUE to one, "
                             f"e.g. --head-arg {label}:...)") from exc
        key = json.dumps([objective, obj.head_config()], sort_keys=True, default=str)
        if key in configs:
            print(f"specbench train: {label} is configured like {configs[key]}: not trained twice", file=sys.stderr)
            continue
        configs[key] = label
        out[label] = obj
    return out


def load_prompts(args: argparse.Namespace, target: Any) -> list[list[int]]:
    from specbench.train.regen import synthetic_prompt_ids, training_prompt_ids

    if args.synthetic_prompts:
        return synthetic_prompt_ids(target.config.vocab_size, args.synthetic_prompts, 4, min(args.max_prompt_len, 48), args.seed)
    sets = [s for s in args.sets.split(",") if s]
    return training_prompt_ids(target, args.data, sets, max_prompt_len=args.max_prompt_len, limit=args.max_prompts,
                               seed=args.seed)


def check_before_loading(args: argparse.Namespace, labels: dict[str, str]) -> None:
    """What needs no model: the heads are trainable and the training prompts (or the corpus) can be found."""
    from specbench.data import TRAINING_SETS, resolve_data_dir
    from specbench.train import OBJECTIVES

    for label, objective in labels.items():
        if objective not in OBJECTIVES and ":" not in objective:  # (a dotted path is imported later)
            entry = objective if label == objective else f"{label}={objective}"
            raise ValueError(f"--drafter {entry}: no training objective of that name; trainable heads: "
                             f"{', '.join(OBJECTIVES.names())}")
    if args.synthetic_prompts or args.corpus:
        return
    sets = [s for s in args.sets.split(",") if s]
    unknown = [s for s in sets if s not in TRAINING_SETS]
    if unknown or not sets:
        raise ValueError(f"--sets {args.sets}: training sets are {', '.join(TRAINING_SETS)}")
    resolve_data_dir(args.data, f"the training prompts ({', '.join(sets)})")


def load_training_data(args: argparse.Namespace, target: Any, out: Path, deadline: float | None, start: float):  # type: ignore[no-untyped-def]
    """(train store, validation store or None, data identity)."""
    from specbench.train.sequences import TokenStore

    if args.corpus:
        from specbench.train import corpus as corpus_mod

        corpus = corpus_mod.Corpus.open(args.corpus)
        if corpus.spec.target_fingerprint != target.fingerprint:
            raise ValueError(f"corpus {args.corpus!r} was answered by target {corpus.spec.target!r} "
                             f"({corpus.spec.target_fingerprint}), not the loaded {target.name!r} ({target.fingerprint})")
        run = out / RUN_FILE
        shards = None
        if run.is_file() and not args.refresh_data:  # a resumed run reads the shards it started with
            shards = json.loads(run.read_text())["data_identity"]["shards"]
        store, plan_index, ks = corpus_mod.load(corpus, shards)
        val_prompts = 64 if args.val_prompts is None else args.val_prompts
        train, val = corpus_mod.split_validation(store, plan_index, val_prompts, corpus.spec.greedy_variant)
        if not len(train):
            raise ValueError(f"--val-prompts {val_prompts} holds out every prompt of the {store.num_prompts} in shards "
                             f"{ks}: pass a smaller --val-prompts or generate more shards")
        if val_prompts and not len(val):  # the held-out prompts are the plan's first: shard 0
            raise ValueError(f"--val-prompts {val_prompts}: the validation prompts are the plan's first {val_prompts}, in "
                             f"shard 0, which corpus {args.corpus!r} lacks (it has shards {ks}): generate shard 0 "
                             f"(specbench corpus generate --shards 0,...) or pass --val-prompts 0 to train without validation")
        identity = {"corpus": corpus.digest, "shards": ks, "val_prompts": val_prompts}
        print(f"specbench train: corpus {args.corpus}: shards {ks}, {len(train)} training and {len(val)} validation "
              f"sequences, {int(train.response_lengths().sum()):,} training response tokens", file=sys.stderr)
        return train, (val if len(val) else None), identity
    from specbench.train.regen import regenerate

    prompts = load_prompts(args, target)
    gen_deadline = start + 60 * args.gen_minutes if args.gen_minutes else deadline
    sequences = regenerate(target, prompts, out / "data", max_new_tokens=args.max_new_tokens, batch_size=args.gen_batch,
                           temperature=args.gen_temperature, seed=args.seed, deadline=gen_deadline, progress=not args.quiet)
    print(f"specbench train: {len(sequences)} regenerated sequences in {out / 'data'}", file=sys.stderr)
    n_val = args.val_prompts or 0
    if n_val >= len(sequences):
        raise ValueError(f"--val-prompts {n_val} leaves no training sequence of the {len(sequences)} regenerated")
    store = TokenStore.from_sequences(sequences)
    val = TokenStore.from_sequences(sequences[:n_val]) if n_val else None
    return TokenStore.from_sequences(sequences[n_val:]) if n_val else store, val, None


def cmd_train(args: argparse.Namespace) -> int:
    from specbench.models import load_target
    from specbench.train.trainer import TrainConfig, Trainer
    from specbench.train.validation import Validator

    start = time.monotonic()
    deadline = start + 60 * args.minutes if args.minutes else None
    labels = parse_drafters(args.drafter)
    settings = parse_head_args(args.head_arg, list(labels))
    labels, settings = expand_grid(labels, settings, args.grid)
    check_before_loading(args, labels)
    TrainConfig(autocast=args.autocast).autocast_labels(list(labels))  # --autocast names heads of this run
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.device.startswith("cuda") and not args.no_tf32:  # the heads' fp32 matmuls on TF32 tensor cores
        import torch

        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    target = load_target(args.target, device=args.device, dtype=dtype)
    objectives = build_objectives(target, labels, settings)  # fail on bad settings before reading data
    out = Path(args.out)
    train_store, val_store, identity = load_training_data(args, target, out, deadline, start)
    usable = int((train_store.response_lengths() >= 2).sum())
    steps = args.steps
    if args.epochs is not None:
        steps = max(1, math.ceil(args.epochs * usable / args.batch_size))
    snapshot = tuple(parse_token_count(t) for t in args.snapshot_tokens.split(",") if t.strip())
    config = TrainConfig(batch_size=args.batch_size, max_len=args.max_len, steps=steps or 1000, lr=args.lr,
                         schedule=args.schedule, warmup_frac=args.warmup_frac, min_lr_frac=args.min_lr_frac,
                         decay_frac=args.decay_frac, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
                         seed=args.seed, save_every=args.save_every, log_every=args.log_every,
                         val_every=args.val_every if val_store is not None else 0,
                         val_tau_every=args.val_tau_every if val_store is not None else 0,
                         snapshot_tokens=snapshot, autocast=args.autocast)
    validator = None
    if val_store is not None and (config.val_every or config.val_tau_every):
        validator = Validator(target, val_store, batch_size=args.batch_size, max_len=args.max_len, seed=args.seed,
                              max_sequences=args.val_sequences, tau_prompts=args.val_tau_prompts,
                              tau_budgets=[int(b) for b in args.val_tau_budgets.split(",") if b],
                              tau_max_new_tokens=args.val_max_new_tokens)
    trainer = Trainer(target, objectives, train_store, config, out, validator=validator, data_identity=identity)
    from specbench.train.trainer import STATE_FILE

    resuming = (out / STATE_FILE).is_file()
    if args.init_heads and not resuming:
        trainer.init_heads(init_sources(args.init_heads, objectives, target))
        print(f"specbench train: heads start from {trainer.init_sources}", file=sys.stderr)
    if trainer.load_state(total_steps=steps, reschedule=args.reschedule, refresh_data=args.refresh_data):
        print(f"specbench train: resumed at step {trainer.step} of {trainer.total_steps} "
              f"({trainer.tokens_seen:,} response tokens trained on)", file=sys.stderr)
    elif steps is None and deadline is not None:
        fit_steps_to_deadline(trainer, deadline, progress=not args.quiet)
    write_run_file(trainer, labels, out)
    trainer.train(steps=args.until_step, deadline=deadline, progress=not args.quiet)
    write_run_file(trainer, labels, out)
    heads = trainer.export_heads(out / "heads", storage=args.head_storage)
    if not args.no_plot:
        from specbench.train.curves import plot_run

        plot_run(out)
    print(f"specbench train: step {trainer.step}/{trainer.total_steps}, {trainer.tokens_seen:,} response tokens, "
          f"{time.monotonic() - start:.0f}s", file=sys.stderr)
    for name, d in heads.items():
        print(f"specbench train: {name} head -> {d}  (use --drafter {objectives[name].drafter} --drafter-arg checkpoint={d})")
    return 0


def init_sources(directory: str | Path, objectives: dict[str, Any], target: Any) -> dict[str, Path]:
    """Each head's checkpoint under `directory` (--init-heads): DIR/LABEL, else DIR/<drafter>-<target>."""
    from specbench.drafters.heads.checkpoint import CONFIG_FILE, default_head_dir

    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"--init-heads {str(directory)!r}: no such directory")
    out = {}
    for label, obj in objectives.items():
        tried = [root / label, root / default_head_dir(obj.drafter, target.name).name]
        found = next((d for d in tried if (d / CONFIG_FILE).is_file()), None)
        if found is None:
            raise ValueError(f"--init-heads {str(directory)!r}: no checkpoint for head {label!r} (looked for "
                             f"{', '.join(str(d) for d in tried)})")
        out[label] = found
    return out


def write_run_file(trainer: Any, labels: dict[str, str], out: Path) -> None:
    """OUT/run.json: what the run is (heads, objectives, data identity, config) and how far it got."""
    from dataclasses import asdict

    out.mkdir(parents=True, exist_ok=True)
    body = {"heads": {n: labels.get(n, n) for n in trainer.objectives}, "data_identity": trainer.data_identity,
            "step": trainer.step, "total_steps": trainer.total_steps, "tokens_seen": trainer.tokens_seen,
            "target_fingerprint": trainer.target.fingerprint, "config": asdict(trainer.config),
            "init_sources": trainer.init_sources}
    (out / RUN_FILE).write_text(json.dumps(body, indent=2, default=str))


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


def cmd_report(args: argparse.Namespace) -> int:
    from specbench.train.curves import format_summary, plot_run, read_log, summarize

    items = summarize(read_log(args.run), flat_frac=args.flat_frac, flat_tol=args.flat_tol)
    print(json.dumps(items, indent=2) if args.json else format_summary(items))
    if not args.no_plot:
        for path in plot_run(args.run, args.plots, compact=args.compact):
            print(f"specbench train-report: {path}", file=sys.stderr)
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    """A copy of a run to move between machines: run.json, the log, a compacted trainer state (and
    with --with the heads / snapshots / plots folders)."""
    import shutil

    import torch

    from specbench.train.trainer import LOG_FILE, STATE_FILE, compact_state

    src, dest = Path(args.run), Path(args.dest)
    if not (src / STATE_FILE).is_file():
        raise FileNotFoundError(f"{str(src / STATE_FILE)!r} does not exist: is {str(src)!r} a `specbench train --out` directory?")
    dest.mkdir(parents=True, exist_ok=True)
    for name in (RUN_FILE, LOG_FILE):
        if (src / name).is_file():
            shutil.copyfile(src / name, dest / name)
    state = compact_state(torch.load(src / STATE_FILE, map_location="cpu", weights_only=False), args.weights, args.moments)
    torch.save(state, dest / STATE_FILE)
    for folder in args.with_ or ():
        if (src / folder).is_dir():
            shutil.copytree(src / folder, dest / folder, dirs_exist_ok=True)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"specbench train-pack: {dest} ({size / 2**20:.1f} MiB; state at step {state['step']}, weights {state['weights']}, "
          f"moments {state['moments']})")
    return 0


def cmd_head_convert(args: argparse.Namespace) -> int:
    """Load a head (fingerprint-checked against its target), write it in `--storage`, print the sizes."""
    from specbench.drafters.heads.checkpoint import CONFIG_FILE, GROUP_BITS
    from specbench.models import load_target
    from specbench.train.head_quant import convert_head
    from specbench.train.regen import training_prompt_ids

    src, dest = Path(args.head), Path(args.dest)
    if not (src / CONFIG_FILE).is_file():
        raise SystemExit(f"specbench head-convert: {str(src)!r} is not a head directory (no {CONFIG_FILE})")
    if dest.resolve() == src.resolve():
        raise SystemExit("specbench head-convert: DEST must differ from HEAD (the source is read while DEST is written)")
    if args.group < 8 or args.group % 8:
        raise SystemExit(f"specbench head-convert: --group must be a multiple of 8, got {args.group}")
    if args.calibrate is not None and args.storage not in GROUP_BITS:
        raise SystemExit(f"specbench head-convert: --calibrate rounds group codes (int4, int3); --storage is "
                         f"{args.storage!r}")
    tree, _, budget = (args.calibration_tree or "").partition(":")
    if budget and not budget.isdigit():
        raise SystemExit(f"specbench head-convert: --calibration-tree takes POLICY:BUDGET, got {args.calibration_tree!r}")
    target_name = args.target or json.loads((src / CONFIG_FILE).read_text()).get("target_name")
    if not target_name:
        raise SystemExit(f"specbench head-convert: {str(src / CONFIG_FILE)!r} names no target_name: pass --target")
    target = load_target(target_name)
    prompts: list[list[int]] = []
    if args.calibrate is not None:
        import torch

        torch.set_num_threads(args.threads)
        prompts = training_prompt_ids(target, args.calibrate, DEFAULT_SETS.split(","), max_prompt_len=384,
                                      limit=args.calibration_prompts, seed=args.seed)
    done = convert_head(src, dest, target, args.storage, prompts=prompts, tree=tree or None,
                        budget=int(budget or 64), max_new_tokens=args.max_new_tokens, group=args.group)
    print(f"{src} ({done.src_bytes:,} bytes) -> {dest} ({done.dest_bytes:,} bytes, {args.storage})")
    if done.errors:
        print(done.summary())
    return 0


def register(subparsers: Any) -> None:
    from specbench.drafters.heads.checkpoint import STORAGE
    from specbench.train import corpus_cli

    p = subparsers.add_parser("train", help="train draft heads (dflash, jetspec, jetspec-tree, eagle3, ...) on a frozen target")
    add_train_args(p)
    p.set_defaults(func=cmd_train)
    r = subparsers.add_parser("train-report", help="a training run's curves: summary and a PNG per head")
    r.add_argument("run", help="a `specbench train --out` directory")
    r.add_argument("--plots", default=None, help="where the PNGs go (default RUN/plots)")
    r.add_argument("--compact", action="store_true", help="small PNGs (70 dpi, 48-colour palette) for copies kept in git")
    r.add_argument("--flat-frac", type=float, default=1 / 3, help="judge flatness over this last fraction of tokens")
    r.add_argument("--flat-tol", type=float, default=0.01, help="flat = validation loss fell by less than this fraction")
    r.add_argument("--json", action="store_true")
    r.add_argument("--no-plot", action="store_true")
    r.set_defaults(func=cmd_report)
    k = subparsers.add_parser("train-pack", help="a smaller copy of a training run, to resume it on another machine")
    k.add_argument("run", help="a `specbench train --out` directory")
    k.add_argument("dest", help="where the copy goes (resume with `specbench train --out DEST ...`)")
    k.add_argument("--weights", default="bf16", choices=["fp32", "bf16"], help="head weights in the copy (default bf16)")
    k.add_argument("--moments", default="none", choices=["fp32", "bf16", "none"],
                   help="optimizer moments in the copy (default none: the resumed run re-warms its learning rate)")
    k.add_argument("--with", dest="with_", action="append", choices=["heads", "snapshots", "plots"],
                   help="also copy this folder of the run")
    k.set_defaults(func=cmd_pack)
    c = subparsers.add_parser("head-convert", help="store a trained head in another kind (int8, int4, int3 or fp32)")
    c.add_argument("head", help="a head directory (head.safetensors + config.json)")
    c.add_argument("dest", help="where the converted head goes")
    c.add_argument("--storage", required=True, choices=STORAGE,
                   help="the new kind; converting a quantized head quantizes its dequantized weights again")
    c.add_argument("--target", default=None, help="target to check the head against (default: the one its config names)")
    c.add_argument("--calibrate", default=None, metavar="DATA_DIR",
                   help="int4 / int3: round by GPTQ on the head's inputs while it drafts training prompts from DATA_DIR")
    c.add_argument("--calibration-prompts", type=int, default=16, help="training prompts drafted for --calibrate")
    c.add_argument("--calibration-tree", default=None, metavar="POLICY:BUDGET",
                   help="tree the calibration drafts with (default ddtree:64, or the drafter's first policy)")
    c.add_argument("--max-new-tokens", type=int, default=128, help="length of each calibration continuation")
    c.add_argument("--group", "--int4-group", dest="group", type=int, default=64,
                   help="int4 / int3: input columns per scale and low, a multiple of 8 that divides the weights' input "
                        "widths (those it does not divide round plainly, padded, and are listed); 32: finer scales, 11 %% "
                        "more bytes than 64 at int4; 192: the shipped int3 heads'")
    c.add_argument("--threads", type=int, default=1, help="torch CPU threads for calibration")
    c.add_argument("--seed", type=int, default=0, help="which training prompts (a shuffle seed)")
    c.set_defaults(func=cmd_head_convert)
    corpus_cli.register(subparsers)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specbench.train.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
