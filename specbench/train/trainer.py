"""The shared trainer: several heads on one frozen target, one target forward per batch.

Each step: the next batch of sequences -> one no-grad target forward (tapped states for the union of
the objectives' taps, full logits as the teacher) -> every objective's loss, backward, clip and step
with its own AdamW and the learning-rate schedule (linear warm-up, then cosine decay or
warm-up-stable-decay). Heads are keyed by a label (e.g. "dflash", or "dflash-num_layers2" in an
ablation grid), so several heads of one objective train side by side.

State (heads, optimizers, schedule, step, data position, tokens trained on, the sampling generator)
is saved to `trainer_state.pt` with every tensor on the CPU, so a run interrupted anywhere (and moved
to another machine: a state written on CUDA loads on a CPU and back) resumes to exactly the state an
uninterrupted one reaches. `compact_state` makes a smaller copy for moving between machines (weights
in bf16, optimizer moments in bf16 or dropped): a run resumed from it goes on close to, not exactly as,
the uninterrupted one; without moments the learning rate re-warms over `rewarm_steps`.

The log (`train_log.jsonl`) holds training records (loss and metrics per head, tokens, throughput),
validation records ("kind": "val") and snapshot records ("kind": "snapshot": the heads exported when
the run had trained on a given number of response tokens, for the tau-against-tokens curve).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import Tensor

from specbench.drafters.heads.backbone import DraftHead
from specbench.drafters.heads.checkpoint import load_head, save_head
from specbench.models.target import TargetModel
from specbench.train.objective import HeadObjective, Metrics, TargetBatch, read_metrics
from specbench.train.sequences import TokenStore, TrainingSequence

if TYPE_CHECKING:
    from specbench.train.validation import Validator

STATE_FILE = "trainer_state.pt"
LOG_FILE = "train_log.jsonl"
SNAPSHOT_DIR = "snapshots"
STATE_FORMAT = 2
SCHEDULES = ("cosine", "wsd")
AUTOCASTS = ("none", "bf16")  # or a comma-separated list of head labels: those heads only
WEIGHTS, MOMENTS = ("fp32", "bf16"), ("fp32", "bf16", "none")
# Settings that define a run: a resumed run must use the same ones (flag to change in the message).
RUN_FIELDS = {"batch_size": "--batch-size", "max_len": "--max-len", "lr": "--lr", "schedule": "--schedule",
              "warmup_frac": "--warmup-frac", "min_lr_frac": "--min-lr-frac", "decay_frac": "--decay-frac",
              "weight_decay": "--weight-decay", "grad_clip": "--grad-clip", "seed": "--seed"}


class ResumeError(ValueError):
    """A saved state does not fit the run asked for; the message names the flag to change."""


@dataclass
class TrainConfig:
    batch_size: int = 8  # sequences per step
    max_len: int = 1024  # sequences are cut to this many tokens
    steps: int = 1000  # schedule length (a call may stop earlier: `train(steps=...)` or a deadline)
    lr: float = 6e-4  # default for objectives that do not set their own `lr`
    schedule: str = "cosine"  # cosine | wsd (warm-up, constant, linear decay over the last decay_frac)
    warmup_frac: float = 0.04
    min_lr_frac: float = 0.1
    decay_frac: float = 0.2  # wsd only
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    save_every: int = 200  # steps between trainer-state checkpoints (0 = only at the end of a call)
    log_every: int = 10
    val_every: int = 0  # steps between validation losses (0 = none)
    val_tau_every: int = 0  # steps between validation tau by exact replay (0 = none)
    snapshot_tokens: tuple[int, ...] = ()  # export the heads once this many response tokens were trained on
    rewarm_steps: int = 50  # LR re-warm-up after resuming from a state without optimizer moments
    # The heads' training forward under bf16 autocast (weights, optimizer and losses stay fp32): "none",
    # "bf16" (every head) or the labels of the heads that use it ("jetspec++,dflash": what pays differs by
    # head, scripts/bench_train_step.py). Not a run setting: a resumed run may switch. Validation always
    # runs without it, so curves compare.
    autocast: str = "none"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"--schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not self.autocast.strip() or any(not x.strip() for x in self.autocast.split(",")):
            raise ValueError(f"--autocast takes none, bf16 or head labels separated by commas, got {self.autocast!r}")
        if self.batch_size < 1 or self.steps < 1:
            raise ValueError("--batch-size and --steps must be >= 1")
        self.snapshot_tokens = tuple(sorted(int(t) for t in self.snapshot_tokens))

    def autocast_labels(self, labels: Sequence[str]) -> set[str]:
        """The heads among `labels` whose forward runs under bf16 autocast; unknown labels refused."""
        if self.autocast in AUTOCASTS:
            return set(labels) if self.autocast == "bf16" else set()
        named = {x.strip() for x in self.autocast.split(",")}
        unknown = named - set(labels)
        if unknown:
            raise ValueError(f"--autocast names {sorted(unknown)}, which this run does not train (heads: "
                             f"{', '.join(labels)}); give none, bf16 or some of those labels")
        return named


def lr_factor(step: int, total: int, warmup_frac: float, min_frac: float, schedule: str = "cosine",
              decay_frac: float = 0.2) -> float:
    """Linear warm-up, then cosine decay to `min_frac` (cosine) or constant until the last
    `decay_frac` of the schedule and a linear decay to `min_frac` there (wsd); step counts from 0.
    wsd lets a run be lengthened (--reschedule) any time before its decay starts."""
    warmup = max(1, int(round(warmup_frac * total)))
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "wsd":
        decay = max(1, int(round(decay_frac * total)))
        start = max(warmup, total - decay)
        if step < start:
            return 1.0
        return max(min_frac, 1.0 - (1.0 - min_frac) * (step - start + 1) / max(1, total - start))
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_frac + (1.0 - min_frac) * 0.5 * (1.0 + math.cos(math.pi * progress))


class SequenceBatches:
    """Random batches of sequences, epoch after epoch; position (epoch, cursor) is resumable."""

    def __init__(self, sequences: TokenStore | Sequence[TrainingSequence], batch_size: int, max_len: int,
                 seed: int) -> None:
        store = sequences if isinstance(sequences, TokenStore) else TokenStore.from_sequences(list(sequences))
        usable = torch.nonzero(store.response_lengths() >= 2)[:, 0]
        if usable.numel() == 0:
            raise ValueError("no training sequence has a response of 2+ tokens: regenerate the data first")
        self.store, self.usable = store, usable
        self.batch_size, self.max_len, self.seed = batch_size, max_len, seed
        self.epoch, self.cursor = 0, 0

    def __len__(self) -> int:
        return int(self.usable.numel())

    def _order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self), generator=g).tolist()

    def next(self) -> list[int]:
        """Store indices of the next batch."""
        order = self._order(self.epoch)
        if self.cursor + self.batch_size > len(order) and self.cursor > 0:
            self.epoch, self.cursor = self.epoch + 1, 0
            order = self._order(self.epoch)
        picked = order[self.cursor: self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return [int(self.usable[i]) for i in picked]

    def collate(self, indices: Sequence[int], device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """tokens [B, T] right-padded with 0, valid [B, T], loss_mask [B, T] (response tokens)."""
        rows, prompt_lens = [], []
        for i in indices:
            prompt = self.store.prompt_ids(i)
            rows.append(torch.cat([prompt, self.store.response_ids(i)])[: self.max_len])
            prompt_lens.append(prompt.numel())
        T = max(r.numel() for r in rows)
        tokens = torch.zeros(len(rows), T, dtype=torch.long)
        valid = torch.zeros(len(rows), T, dtype=torch.bool)
        loss_mask = torch.zeros(len(rows), T, dtype=torch.bool)
        for i, (r, p) in enumerate(zip(rows, prompt_lens)):
            tokens[i, : r.numel()] = r
            valid[i, : r.numel()] = True
            loss_mask[i, p: r.numel()] = True
        return tokens.to(device), valid.to(device), loss_mask.to(device)


def token_counts(sequences: TokenStore | Sequence[TrainingSequence], vocab_size: int) -> Tensor:
    """[V] int64 counts of the response tokens."""
    store = sequences if isinstance(sequences, TokenStore) else TokenStore.from_sequences(list(sequences))
    return store.response_counts(vocab_size)


@torch.no_grad()
def target_batch(target: TargetModel, tokens: Tensor, valid: Tensor, loss_mask: Tensor, taps: Sequence[int]) -> TargetBatch:
    """The frozen target over right-padded sequences (causal, fresh cache): taps + all logits. Inputs
    on the CPU move to the target's device; their CPU masks stay in the batch (`host_masks`)."""
    host_valid, host_mask = (valid, loss_mask) if valid.device.type == "cpu" else (None, None)
    tokens, valid, loss_mask = (x.to(target.device) for x in (tokens, valid, loss_mask))
    b, t = tokens.shape
    cache = target.new_cache(t, batch=b)
    pos = torch.arange(t, device=tokens.device)[None].expand(b, t)
    out = target.model(tokens, pos, cache, None, taps=tuple(taps), kv_len=t)
    return TargetBatch(tokens=tokens, valid=valid, loss_mask=loss_mask, hidden=out.hidden, target_logits=out.logits,
                       host_valid=host_valid, host_loss_mask=host_mask)


def _to_cpu(obj: Any, float_dtype: torch.dtype | None = None) -> Any:
    """Every tensor of a nested state on the CPU (floating ones cast to float_dtype when given;
    Adam's `step` counters stay as they are)."""
    if isinstance(obj, Tensor):
        t = obj.detach().cpu()
        return t.to(float_dtype) if float_dtype is not None and t.is_floating_point() and t.ndim > 0 else t
    if isinstance(obj, dict):
        return {k: _to_cpu(v, float_dtype) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v, float_dtype) for v in obj)
    return obj


def compact_state(state: dict[str, Any], weights: str = "bf16", moments: str = "none") -> dict[str, Any]:
    """A smaller copy of a saved trainer state (see the module docstring). fp32 weights + fp32 moments
    is the exact state; each step down saves a third of it (bf16 weights: a sixth of the exact size)."""
    if weights not in WEIGHTS or moments not in MOMENTS:
        raise ValueError(f"weights must be one of {WEIGHTS} and moments one of {MOMENTS}, got {weights!r}, {moments!r}")
    out = dict(state)
    if weights == "bf16":
        out["heads"] = _to_cpu(state["heads"], torch.bfloat16)
    if moments == "none":
        out["optimizers"] = {n: {**sd, "state": {}} for n, sd in state["optimizers"].items()}
        out["rewarm_from"] = state["step"]
    elif moments == "bf16":
        out["optimizers"] = _to_cpu(state["optimizers"], torch.bfloat16)
    out["weights"] = weights if state.get("weights", "fp32") == "fp32" else state["weights"]
    out["moments"] = moments if state.get("moments", "fp32") != "none" else "none"
    return out


def tokens_label(count: int) -> str:
    """400000 -> '0.4M', 2000000 -> '2M', 1500 -> '1.5k' (snapshot names and plot labels)."""
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return str(count)


class Trainer:
    def __init__(self, target: TargetModel, objectives: dict[str, HeadObjective],
                 sequences: TokenStore | Sequence[TrainingSequence], config: TrainConfig, out_dir: str | Path, *,
                 validator: "Validator | None" = None, data_identity: Any = None) -> None:
        if not objectives:
            raise ValueError("nothing to train: give at least one objective")
        self.target, self.objectives, self.config = target, objectives, config
        self.out = Path(out_dir)
        self.taps = tuple(sorted({t for o in objectives.values() for t in o.taps}))
        self.data = SequenceBatches(sequences, config.batch_size, config.max_len, config.seed)
        self.store = self.data.store
        self.validator, self.data_identity = validator, data_identity
        self.generator = torch.Generator().manual_seed(config.seed)
        self.autocast_heads = config.autocast_labels(list(objectives))
        self.step = 0
        self.total_steps = config.steps
        self.tokens_seen = 0  # response (label) tokens of the batches trained on
        self.seq_tokens = 0  # all tokens the target ran over
        self.snapshots_done: list[int] = []
        self.rewarm_from: int | None = None
        self.init_sources: dict[str, str] = {}  # head -> the checkpoint it started from (init_heads)
        counts = self.store.response_counts(target.config.vocab_size)
        for obj in objectives.values():
            obj.prepare(counts)
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        for name, obj in objectives.items():
            lr = getattr(obj, "lr", None) or config.lr
            params = [p for p in obj.head.parameters() if p.requires_grad]
            self.optimizers[name] = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
            for group in self.optimizers[name].param_groups:
                group["base_lr"] = lr

    # ---- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The whole (exact) run state, every tensor on the CPU."""
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            "total_steps": self.total_steps,
            "data": {"epoch": self.data.epoch, "cursor": self.data.cursor},
            "data_identity": self.data_identity,
            "tokens_seen": self.tokens_seen,
            "seq_tokens": self.seq_tokens,
            "snapshots_done": list(self.snapshots_done),
            "rewarm_from": self.rewarm_from,
            "init_sources": dict(self.init_sources),
            "generator": self.generator.get_state(),
            "heads": {n: _to_cpu(o.head.state_dict()) for n, o in self.objectives.items()},
            "head_configs": {n: o.head_config() for n, o in self.objectives.items()},
            "optimizers": {n: _to_cpu(opt.state_dict()) for n, opt in self.optimizers.items()},
            "weights": "fp32",
            "moments": "fp32",
            "config": asdict(self.config),
            "target_fingerprint": self.target.fingerprint,
        }

    def save_state(self, path: str | Path | None = None) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        path = Path(path) if path is not None else self.out / STATE_FILE
        tmp = path.with_suffix(".partial")
        torch.save(self.state_dict(), tmp)
        tmp.replace(path)
        return path

    def load_state(self, path: str | Path | None = None, *, total_steps: int | None = None, reschedule: bool = False,
                   refresh_data: bool = False) -> bool:
        """Resume from `path` (default out_dir/trainer_state.pt); False if there is none. The saved
        schedule length is kept unless `total_steps` differs and `reschedule`; a run whose data
        identity changed (e.g. shards added to its corpus) continues only with `refresh_data`, which
        starts a new epoch over the new data."""
        p = Path(path) if path is not None else self.out / STATE_FILE
        if not p.is_file():
            return False
        state = torch.load(p, map_location="cpu", weights_only=False)
        if state.get("format") != STATE_FORMAT:
            raise ResumeError(f"{str(p)!r} is a trainer state of format {state.get('format')!r} (this trainer writes "
                              f"{STATE_FORMAT}): use a fresh --out directory")
        if state["target_fingerprint"] != self.target.fingerprint:
            raise ResumeError(f"{str(p)!r} was saved while training on another target: use a fresh --out directory")
        missing = set(self.objectives) - set(state["heads"])
        if missing:
            raise ResumeError(f"{str(p)!r} has no state for {sorted(missing)} (it has {sorted(state['heads'])}): "
                              f"resume with the same --drafter list")
        for name, obj in self.objectives.items():
            if state["head_configs"][name] != obj.head_config():
                raise ResumeError(f"{name}: the saved head was configured {state['head_configs'][name]}, this run "
                                  f"asks for {obj.head_config()}: resume with the same --head-arg settings")
        saved = state["config"]
        for key, flag in RUN_FIELDS.items():
            if saved[key] != getattr(self.config, key):
                raise ResumeError(f"{str(p)!r} was trained with {key}={saved[key]!r}, not {getattr(self.config, key)!r}: "
                                  f"pass {flag} {saved[key]} (or a fresh --out directory)")
        if state["data_identity"] != self.data_identity and not refresh_data:
            raise ResumeError(f"the training data changed since {str(p)!r} was saved ({state['data_identity']} -> "
                              f"{self.data_identity}): pass --refresh-data to go on with the new data")
        self.total_steps = state["total_steps"]
        if total_steps is not None and total_steps != self.total_steps:
            if not reschedule:
                raise ResumeError(f"{str(p)!r} has a schedule of {self.total_steps} steps, not {total_steps}: pass "
                                  f"--reschedule to change it (with --schedule wsd before its decay starts)")
            if total_steps < state["step"]:
                raise ResumeError(f"--steps {total_steps} is below the {state['step']} steps already trained")
            self.total_steps = total_steps
        for name, obj in self.objectives.items():
            obj.head.load_state_dict(state["heads"][name])  # copied into the fp32 parameters whatever the saved dtype
            self.optimizers[name].load_state_dict(state["optimizers"][name])  # moments cast to the params' device/dtype
        self.step = state["step"]
        self.data.epoch, self.data.cursor = state["data"]["epoch"], state["data"]["cursor"]
        if state["data_identity"] != self.data_identity:  # refresh_data: a fresh epoch over the new data
            self.data.epoch, self.data.cursor = self.data.epoch + 1, 0
        self.tokens_seen, self.seq_tokens = state["tokens_seen"], state["seq_tokens"]
        self.snapshots_done = list(state["snapshots_done"])
        self.rewarm_from = state["rewarm_from"]
        self.init_sources = dict(state.get("init_sources", {}))
        self.generator.set_state(state["generator"])
        return True

    def init_heads(self, sources: dict[str, str | Path]) -> None:
        """Start the named heads from trained checkpoints (e.g. the shipped heads, to train them on
        where an earlier run's state is gone): the weights only, dequantized to fp32; the optimizer
        moments, step and schedule start fresh (its warm-up re-warms). The architecture must match:
        the saved head config, its training settings aside, equals this objective's, except that a
        draft head with fewer layers grows into a deeper one (`DraftHead.load_grown`: the added
        layers start as identity maps, so the run starts from the saved head's drafts)."""
        if self.step:
            raise ValueError(f"init_heads starts a fresh run: this one is at step {self.step}")
        for name, directory in sources.items():
            obj = self.objectives[name]
            state, saved = load_head(directory, self.target, dtype=torch.float32)
            want = {k: v for k, v in obj.head_config().items() if k != "train"}
            have = {k: v for k, v in saved.items() if k != "train"}
            diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            grow = (diff == ["num_layers"] and isinstance(obj.head, DraftHead)
                    and int(have["num_layers"]) < int(want["num_layers"]))
            if grow:
                obj.head.load_grown(state, int(have["num_layers"]))
                self.init_sources[name] = f"{directory} (grown from {have['num_layers']} to {want['num_layers']} layers)"
                continue
            if want != have:
                raise ValueError(f"--init-heads: the head in {str(directory)!r} differs from the {name!r} head this run "
                                 f"builds in {diff} ({ {k: have.get(k) for k in diff} } vs { {k: want.get(k) for k in diff} }):"
                                 f" set them with --head-arg {name}:KEY=VALUE")
            obj.head.load_state_dict(state)
            self.init_sources[name] = str(directory)

    def drop(self, name: str) -> None:
        """Stop training one objective (e.g. one whose first step failed)."""
        del self.objectives[name], self.optimizers[name]
        self.taps = tuple(sorted({t for o in self.objectives.values() for t in o.taps}))

    def export_heads(self, directory: str | Path, *, storage: str) -> dict[str, Path]:
        """Each head as <directory>/<label>/ (head.safetensors + config.json), stored as `storage`
        ("int8", "int4" or "fp32": checkpoint.py)."""
        out = {}
        for name, obj in self.objectives.items():
            d = Path(directory) / name
            save_head(d, obj.head, obj.head_config(), self.target, storage=storage)
            out[name] = d
        return out

    def export_snapshot(self, milestone: int) -> Path:
        """The heads (int8, as they ship) at `milestone` response tokens: snapshots/tokNNN/<label>/."""
        d = self.out / SNAPSHOT_DIR / f"tok{milestone:010d}"
        self.export_heads(d, storage="int8")
        (d / "snapshot.json").write_text(json.dumps({"milestone": milestone, "label": tokens_label(milestone),
                                                     "tokens_seen": self.tokens_seen, "step": self.step,
                                                     "heads": sorted(self.objectives)}, indent=2))
        self.snapshots_done.append(milestone)
        return d

    # ---- training ----------------------------------------------------------------------------------
    def lr_scale(self) -> float:
        cfg = self.config
        factor = lr_factor(self.step, self.total_steps, cfg.warmup_frac, cfg.min_lr_frac, cfg.schedule, cfg.decay_frac)
        if self.rewarm_from is not None and self.step - self.rewarm_from < cfg.rewarm_steps:
            factor *= (self.step - self.rewarm_from + 1) / cfg.rewarm_steps
        return factor

    def head_precision(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """The context head `name`'s training forward runs in (`autocast`); backward runs outside it."""
        if name in self.autocast_heads:
            return torch.autocast(self.target.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def next_target_batch(self) -> TargetBatch:
        """The next batch of sequences through the frozen target."""
        tokens, valid, loss_mask = self.data.collate(self.data.next(), torch.device("cpu"))
        return target_batch(self.target, tokens, valid, loss_mask, self.taps)

    def objective_step(self, name: str, batch: TargetBatch, factor: float) -> Metrics:
        """One head's loss (under `head_precision`), backward, clip and optimizer step at learning-rate
        factor `factor`; its metrics prefixed by its label, still on the device."""
        obj, opt = self.objectives[name], self.optimizers[name]
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * factor
        obj.head.train()
        with self.head_precision(name):
            loss, parts = obj.loss(batch, self.generator)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(obj.head.parameters(), self.config.grad_clip)
        opt.step()
        return {f"{name}/loss": loss.detach(), f"{name}/grad_norm": grad_norm, **{f"{name}/{k}": v for k, v in parts.items()}}

    def train_step(self) -> dict[str, float]:
        """The next batch through every objective; returns the metrics, prefixed by the head's label."""
        batch = self.next_target_batch()
        host_valid, host_mask = batch.host_masks()
        pending: Metrics = {}
        factor = self.lr_scale()
        for name in self.objectives:
            pending.update(self.objective_step(name, batch, factor))
        metrics = read_metrics(pending)  # the step's one wait on the device
        for name in self.objectives:  # checked after the steps: the run stops before any state is saved
            if not math.isfinite(metrics[f"{name}/loss"]):
                raise FloatingPointError(f"{name}: non-finite loss at step {self.step}; lower the learning rate (--lr)")
        metrics["lr_factor"] = factor
        self.tokens_seen += int(host_mask.sum())
        self.seq_tokens += int(host_valid.sum())
        self.step += 1
        return metrics

    def validate(self, tau: bool) -> dict[str, Any]:
        """One validation record (losses; tau by replay when `tau`), also appended to the log."""
        assert self.validator is not None
        t0 = time.monotonic()
        record: dict[str, Any] = {"kind": "val", "step": self.step, "tokens": self.tokens_seen,
                                  **self.validator.losses(self)}
        if tau:
            record.update(self.validator.tau(self))
        record["val_s"] = round(time.monotonic() - t0, 2)
        self._log(record)
        return record

    def _log(self, record: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / LOG_FILE, "a") as log:
            log.write(json.dumps(record) + "\n")

    def _periodic(self, stop: int) -> None:
        """Snapshots, validation and checkpoints due after the step just taken."""
        cfg = self.config
        for milestone in cfg.snapshot_tokens:
            if milestone <= self.tokens_seen and milestone not in self.snapshots_done:
                d = self.export_snapshot(milestone)
                self._log({"kind": "snapshot", "step": self.step, "tokens": self.tokens_seen, "milestone": milestone,
                           "dir": str(d.relative_to(self.out))})
        if self.validator is not None:
            due_tau = bool(cfg.val_tau_every) and self.step % cfg.val_tau_every == 0
            due = bool(cfg.val_every) and self.step % cfg.val_every == 0
            end = self.step == self.total_steps and bool(cfg.val_every or cfg.val_tau_every)
            if due or due_tau or end:
                self.validate(tau=due_tau or (end and bool(cfg.val_tau_every)))
        if cfg.save_every and self.step % cfg.save_every == 0 and self.step < stop:
            self.save_state()

    def train(self, steps: int | None = None, deadline: float | None = None, progress: bool = True,
              checkpoint: bool = True) -> int:
        """Train until `self.step` reaches `steps` (default: the schedule length) or time.monotonic()
        passes `deadline`; validates, snapshots and checkpoints as configured, and (checkpoint) saves
        the state at the end. Returns the step."""
        from tqdm import tqdm

        cfg = self.config
        stop = min(steps if steps is not None else self.total_steps, self.total_steps)
        self.out.mkdir(parents=True, exist_ok=True)
        if self.validator is not None and self.step == 0 and (cfg.val_every or cfg.val_tau_every):
            self.validate(tau=bool(cfg.val_tau_every))  # the curves' starting point
        bar = tqdm(total=stop, initial=self.step, desc="training", disable=not progress, mininterval=5.0, dynamic_ncols=True)
        t0 = time.monotonic()
        busy = 0.0  # seconds spent in steps since the last log record (validation and saving excluded)
        seq0, tok0, step0 = self.seq_tokens, self.tokens_seen, self.step
        while self.step < stop:
            if deadline is not None and time.monotonic() > deadline:
                break
            t_step = time.monotonic()
            metrics = self.train_step()
            busy += time.monotonic() - t_step
            if self.step % cfg.log_every == 0 or self.step == stop:
                n = self.step - step0
                self._log({"step": self.step, "time": round(time.monotonic() - t0, 2), "tokens": self.tokens_seen,
                           "seq_tokens": self.seq_tokens, "step_s": round(busy / max(n, 1), 4),
                           "tok_s": round((self.seq_tokens - seq0) / max(busy, 1e-9), 1),
                           "resp_tok_s": round((self.tokens_seen - tok0) / max(busy, 1e-9), 1), **metrics})
                busy, seq0, tok0, step0 = 0.0, self.seq_tokens, self.tokens_seen, self.step
                bar.set_postfix({k.replace("/loss", ""): f"{v:.3f}" for k, v in metrics.items() if k.endswith("/loss")})
            bar.update(1)
            self._periodic(stop)
        bar.close()
        if checkpoint:
            self.save_state()
        return self.step


__all__ = ["LOG_FILE", "STATE_FILE", "SNAPSHOT_DIR", "ResumeError", "SequenceBatches", "TrainConfig", "Trainer",
           "TrainingSequence", "compact_state", "lr_factor", "target_batch", "token_counts", "tokens_label"]
