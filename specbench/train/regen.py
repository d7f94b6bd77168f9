"""Training data: prompts answered by the target itself (so the head learns the target's own law),
cached on disk as token ids.

Generation is batched (`specbench.engine.generate_batch`). The cache file is JSONL, one line per
answered prompt ({"key", "prompt", "response"}), appended batch by batch: an interrupted run resumes
by skipping the keys already there.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Iterable, Sequence

import torch

from specbench.engine import generate_batch
from specbench.models.target import TargetModel
from specbench.train.sequences import TrainingSequence

META_FILE = "regen_meta.json"
DATA_FILE = "sequences.jsonl"


def training_prompt_ids(target: TargetModel, data_dir: str | Path | None, sets: Sequence[str], *,
                        max_prompt_len: int, limit: int | None = None, seed: int = 0) -> list[list[int]]:
    """Chat-formatted token ids of the training prompts (never evaluation sets), shuffled with `seed`
    so that any prefix mixes every set; prompts longer than `max_prompt_len` tokens are skipped."""
    from specbench.data import training_prompts

    if target.tokenizer is None:
        raise ValueError(f"target {target.name!r} has no tokenizer: it cannot read text prompts "
                         f"(use synthetic_prompt_ids for random test targets)")
    texts = [t for name in sets for t in training_prompts(name, data_dir)]
    random.Random(seed).shuffle(texts)
    out: list[list[int]] = []
    for text in texts:
        ids = target.encode_chat(text)
        if len(ids) <= max_prompt_len:
            out.append(ids)
        if limit is not None and len(out) >= limit:
            break
    return out


def synthetic_prompt_ids(vocab: int, count: int, min_len: int, max_len: int, seed: int = 0) -> list[list[int]]:
    """Random token-id prompts, for tokenizer-less random targets (tests, dry runs)."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(min_len, max_len))] for _ in range(count)]


def regenerate(target: TargetModel, prompts: Sequence[Sequence[int]], out_dir: str | Path, *, max_new_tokens: int,
               batch_size: int, temperature: float = 0.0, seed: int = 0, deadline: float | None = None,
               progress: bool = True) -> list[TrainingSequence]:
    """Answer every prompt not yet in `out_dir` (in order, batch by batch, stopping cleanly at
    `deadline` (time.monotonic())), and return every cached sequence."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"target": target.name, "target_fingerprint": target.fingerprint, "max_new_tokens": max_new_tokens,
            "temperature": temperature, "seed": seed}
    meta_path = out / META_FILE
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        if old != meta:
            raise ValueError(f"{str(out)!r} holds sequences generated with {old}, not {meta}: use another directory")
    else:
        meta_path.write_text(json.dumps(meta, indent=2))
    data_path = out / DATA_FILE
    _drop_partial_line(data_path)
    done = {int(r["key"]) for r in _read(data_path)}
    todo = [k for k in range(len(prompts)) if k not in done]
    generator = torch.Generator(device=target.device).manual_seed(seed + len(done))
    window = 8 * batch_size  # sort by length inside windows: less padding, sets stay mixed
    bar = _progress(len(todo), "regenerating", progress)
    with open(data_path, "a") as f:
        for w in range(0, len(todo), window):
            chunk = sorted(todo[w: w + window], key=lambda k: len(prompts[k]))
            for s in range(0, len(chunk), batch_size):
                if deadline is not None and time.monotonic() > deadline:
                    bar.close()
                    return load_sequences(out)
                keys = chunk[s: s + batch_size]
                responses = generate_batch(target, [prompts[k] for k in keys], max_new_tokens, temperature, generator)
                for k, r in zip(keys, responses):
                    f.write(json.dumps({"key": k, "prompt": list(prompts[k]), "response": r}) + "\n")
                f.flush()
                bar.update(len(keys))
    bar.close()
    return load_sequences(out)


def load_sequences(out_dir: str | Path) -> list[TrainingSequence]:
    """Every cached sequence, in key order."""
    rows = sorted(_read(Path(out_dir) / DATA_FILE), key=lambda r: int(r["key"]))
    return [TrainingSequence(prompt=list(r["prompt"]), response=list(r["response"])) for r in rows]


def _drop_partial_line(path: Path) -> None:
    """Cut a last line left unfinished by an interruption, so appends start on a fresh line."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def _read(path: Path) -> Iterable[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by an interruption: regenerated on resume
                continue
    return rows


def _progress(total: int, desc: str, enabled: bool):  # type: ignore[no-untyped-def]
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, mininterval=5.0, dynamic_ncols=True)
