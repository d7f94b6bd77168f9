"""The shared trainer: several heads on one frozen target, one target forward per batch.

Each step: the next batch of regenerated sequences -> one no-grad target forward (tapped states for
the union of the objectives' taps, full logits as the teacher) -> every objective's loss, backward,
clip and step with its own AdamW and warmup + cosine schedule. State (heads, optimizers, schedules,
step, data position, the sampling generator) is saved to `trainer_state.pt` so an interrupted run
resumes to exactly the state an uninterrupted one reaches.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from specbench.drafters.heads.checkpoint import save_head
from specbench.models.target import TargetModel
from specbench.train.objective import HeadObjective, TargetBatch
from specbench.train.regen import TrainingSequence

STATE_FILE = "trainer_state.pt"
LOG_FILE = "train_log.jsonl"


@dataclass
class TrainConfig:
    batch_size: int = 8  # sequences per step
    max_len: int = 1024  # sequences are cut to this many tokens
    steps: int = 1000  # schedule length (training may stop earlier at a deadline)
    lr: float = 6e-4  # default for objectives that do not set their own `lr`
    warmup_frac: float = 0.04
    min_lr_frac: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    save_every: int = 200  # steps between trainer-state checkpoints (0 = only at the end)
    log_every: int = 10


def lr_factor(step: int, total: int, warmup_frac: float, min_frac: float) -> float:
    """Linear warmup then cosine decay to `min_frac` (step counts from 0)."""
    warmup = max(1, int(round(warmup_frac * total)))
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_frac + (1.0 - min_frac) * 0.5 * (1.0 + math.cos(math.pi * progress))


class SequenceBatches:
    """Random batches of sequences, epoch after epoch; position (epoch, cursor) is resumable."""

    def __init__(self, sequences: Sequence[TrainingSequence], batch_size: int, max_len: int, seed: int) -> None:
        usable = [s for s in sequences if len(s.response) >= 2]
        if not usable:
            raise ValueError("no training sequence has a response of 2+ tokens: regenerate the data first")
        self.sequences, self.batch_size, self.max_len, self.seed = usable, batch_size, max_len, seed
        self.epoch, self.cursor = 0, 0

    def _order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.sequences), generator=g).tolist()

    def next(self) -> list[TrainingSequence]:
        order = self._order(self.epoch)
        if self.cursor + self.batch_size > len(order) and self.cursor > 0:
            self.epoch, self.cursor = self.epoch + 1, 0
            order = self._order(self.epoch)
        picked = order[self.cursor: self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return [self.sequences[i] for i in picked]

    def collate(self, seqs: list[TrainingSequence], device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """tokens [B, T] right-padded with 0, valid [B, T], loss_mask [B, T] (response tokens)."""
        rows = [(s.prompt + s.response)[: self.max_len] for s in seqs]
        T = max(len(r) for r in rows)
        tokens = torch.zeros(len(rows), T, dtype=torch.long)
        valid = torch.zeros(len(rows), T, dtype=torch.bool)
        loss_mask = torch.zeros(len(rows), T, dtype=torch.bool)
        for i, (s, r) in enumerate(zip(seqs, rows)):
            tokens[i, : len(r)] = torch.tensor(r)
            valid[i, : len(r)] = True
            loss_mask[i, len(s.prompt): len(r)] = True
        return tokens.to(device), valid.to(device), loss_mask.to(device)


def token_counts(sequences: Sequence[TrainingSequence], vocab_size: int) -> Tensor:
    """[V] int64 counts of the response tokens."""
    ids = torch.tensor([t for s in sequences for t in s.response], dtype=torch.long)
    return torch.bincount(ids, minlength=vocab_size)


@torch.no_grad()
def target_batch(target: TargetModel, tokens: Tensor, valid: Tensor, loss_mask: Tensor, taps: Sequence[int]) -> TargetBatch:
    """The frozen target over right-padded sequences (causal, fresh cache): taps + all logits."""
    b, t = tokens.shape
    cache = target.new_cache(t, batch=b)
    pos = torch.arange(t, device=tokens.device)[None].expand(b, t)
    out = target.model(tokens, pos, cache, None, taps=tuple(taps), kv_len=t)
    return TargetBatch(tokens=tokens, valid=valid, loss_mask=loss_mask, hidden=out.hidden, target_logits=out.logits)


class Trainer:
    def __init__(self, target: TargetModel, objectives: dict[str, HeadObjective], sequences: Sequence[TrainingSequence],
                 config: TrainConfig, out_dir: str | Path) -> None:
        if not objectives:
            raise ValueError("nothing to train: give at least one objective")
        self.target, self.objectives, self.config = target, objectives, config
        self.out = Path(out_dir)
        self.taps = tuple(sorted({t for o in objectives.values() for t in o.taps}))
        self.data = SequenceBatches(sequences, config.batch_size, config.max_len, config.seed)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.step = 0
        self.total_steps = config.steps
        counts = token_counts(self.data.sequences, target.config.vocab_size)
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
        return {
            "step": self.step,
            "total_steps": self.total_steps,
            "data": {"epoch": self.data.epoch, "cursor": self.data.cursor},
            "generator": self.generator.get_state(),
            "heads": {n: o.head.state_dict() for n, o in self.objectives.items()},
            "optimizers": {n: opt.state_dict() for n, opt in self.optimizers.items()},
            "config": asdict(self.config),
            "target_fingerprint": self.target.fingerprint,
        }

    def save_state(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / STATE_FILE
        tmp = path.with_suffix(".partial")
        torch.save(self.state_dict(), tmp)
        tmp.replace(path)
        return path

    def load_state(self, path: str | Path | None = None) -> bool:
        """Resume from `path` (default out_dir/trainer_state.pt); False if there is none."""
        p = Path(path) if path is not None else self.out / STATE_FILE
        if not p.is_file():
            return False
        state = torch.load(p, map_location=self.target.device, weights_only=False)
        if state["target_fingerprint"] != self.target.fingerprint:
            raise ValueError(f"{str(p)!r} was saved while training on another target: use a fresh --out directory")
        missing = set(self.objectives) - set(state["heads"])
        if missing:
            raise ValueError(f"{str(p)!r} has no state for {sorted(missing)}: resume with the same --drafter list")
        for name, obj in self.objectives.items():
            obj.head.load_state_dict(state["heads"][name])
            self.optimizers[name].load_state_dict(state["optimizers"][name])
        self.step, self.total_steps = state["step"], state["total_steps"]
        self.data.epoch, self.data.cursor = state["data"]["epoch"], state["data"]["cursor"]
        self.generator.set_state(state["generator"])
        return True

    def drop(self, name: str) -> None:
        """Stop training one objective (e.g. one whose first step failed)."""
        del self.objectives[name], self.optimizers[name]
        self.taps = tuple(sorted({t for o in self.objectives.values() for t in o.taps}))

    def export_heads(self, directory: str | Path, *, int8: bool) -> dict[str, Path]:
        """Each head as <directory>/<name>/ (head.safetensors + config.json)."""
        out = {}
        for name, obj in self.objectives.items():
            d = Path(directory) / name
            save_head(d, obj.head, obj.head_config(), self.target, int8=int8)
            out[name] = d
        return out

    # ---- training ----------------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """One batch through every objective; returns the metrics, prefixed by objective name."""
        cfg = self.config
        tokens, valid, loss_mask = self.data.collate(self.data.next(), self.target.device)
        batch = target_batch(self.target, tokens, valid, loss_mask, self.taps)
        metrics: dict[str, float] = {}
        factor = lr_factor(self.step, self.total_steps, cfg.warmup_frac, cfg.min_lr_frac)
        for name, obj in self.objectives.items():
            opt = self.optimizers[name]
            for group in opt.param_groups:
                group["lr"] = group["base_lr"] * factor
            obj.head.train()
            loss, parts = obj.loss(batch, self.generator)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{name}: non-finite loss at step {self.step}; lower the learning rate")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(obj.head.parameters(), cfg.grad_clip)
            opt.step()
            metrics[f"{name}/loss"] = float(loss.detach())
            metrics[f"{name}/grad_norm"] = float(grad_norm)
            metrics.update({f"{name}/{k}": v for k, v in parts.items()})
        self.step += 1
        return metrics

    def train(self, steps: int | None = None, deadline: float | None = None, progress: bool = True,
              checkpoint: bool = True) -> int:
        """Train until `self.step` reaches `steps` (default: the schedule length) or time.monotonic()
        passes `deadline`; checkpoints every `save_every` steps and (checkpoint) at the end. Returns the step."""
        from tqdm import tqdm

        cfg = self.config
        stop = min(steps if steps is not None else self.total_steps, self.total_steps)
        self.out.mkdir(parents=True, exist_ok=True)
        bar = tqdm(total=stop, initial=self.step, desc="training", disable=not progress, mininterval=5.0, dynamic_ncols=True)
        t0 = time.monotonic()
        with open(self.out / LOG_FILE, "a") as log:
            while self.step < stop:
                if deadline is not None and time.monotonic() > deadline:
                    break
                metrics = self.train_step()
                if self.step % cfg.log_every == 0 or self.step == stop:
                    record = {"step": self.step, "time": round(time.monotonic() - t0, 2), **metrics}
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                    bar.set_postfix({k.replace("/loss", ""): f"{v:.3f}" for k, v in metrics.items() if k.endswith("/loss")})
                bar.update(1)
                if cfg.save_every and self.step % cfg.save_every == 0:
                    self.save_state()
        bar.close()
        if checkpoint:
            self.save_state()
        return self.step
