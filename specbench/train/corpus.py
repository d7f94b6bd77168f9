"""The training corpus at scale: every training prompt answered by the target (greedy and sampled
responses), made once in shards that are generated, resumed, moved between machines and merged.

A corpus directory:

    corpus.json                  the spec (target fingerprint and dtype, prompt sets, sampling, seed, shard
                                 size) and the plan's digest
    shard-00012.npz              a finished shard: its prompts (ids and tokens), every response, provenance
    partial/shard-00012.jsonl    a shard being generated: a header line, then one line per finished unit

The plan is the list of training prompts (never evaluation items; ids like "gsm8k_train:17",
"mbpp_train:604", "sharegpt:<id>"), chat-formatted, those longer than max_prompt_len dropped, shuffled
with the seed; shard k holds plan entries [k*S, (k+1)*S). Any machine with the data rebuilds the same
plan and checks it against the digest. A shard is answered in units: its prompts sorted by length,
cut into batches of gen_batch (recorded in the partial header, so a resumed shard keeps its batches),
each batch answered once per distinct temperature (equal temperatures share one batched call). A unit's
sampled responses draw from a generator seeded by (sample seed, shard, batch, temperature group), so a
shard finished after any number of interruptions holds exactly what an uninterrupted run writes. The sample
seed is the seed unless `sample_seed` names another: the same plan (prompts, shards, greedy responses and so
the validation split) with fresh samples, which is how a machine that regenerates the corpus each session
trains on new responses rather than on the same ones again.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from specbench.models.target import TargetModel
from specbench.train.sequences import TokenStore

SPEC_FILE = "corpus.json"
PARTIAL_DIR = "partial"
FORMAT_VERSION = 1
SYNTHETIC = "synthetic:"  # "synthetic:N": N random-token prompts (tokenizer-less random targets: tests, dry runs)


class CorpusError(ValueError):
    """A corpus, shard or request does not fit together; the message says what to change."""


@dataclass(frozen=True)
class CorpusSpec:
    """What fixes a corpus's content. One response per entry of `temperatures` (0 = greedy)."""

    target: str
    target_fingerprint: str
    dtype: str
    sets: tuple[str, ...]
    max_prompt_len: int
    max_new_tokens: int
    temperatures: tuple[float, ...]
    seed: int
    shard_size: int
    sample_seed: int | None = None  # the sampled responses' seed; None = seed (corpora made before it existed)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sets", tuple(self.sets))
        object.__setattr__(self, "temperatures", tuple(float(t) for t in self.temperatures))
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise CorpusError(f"--temperatures needs one or more values >= 0 (0 = greedy), got {self.temperatures}")
        if self.shard_size < 1 or self.max_new_tokens < 1 or self.max_prompt_len < 1:
            raise CorpusError("--shard-size, --max-new-tokens and --max-prompt-len must be >= 1")
        if not self.sets:
            raise CorpusError("--sets names no prompt set")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sets"], d["temperatures"] = list(self.sets), list(self.temperatures)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CorpusSpec":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})  # absent: the field's default

    @property
    def sampling_seed(self) -> int:
        return self.seed if self.sample_seed is None else self.sample_seed

    @property
    def groups(self) -> list[tuple[float, list[int]]]:
        """(temperature, the response variants answered at it), in order of first appearance."""
        out: dict[float, list[int]] = {}
        for v, t in enumerate(self.temperatures):
            out.setdefault(t, []).append(v)
        return list(out.items())

    @property
    def greedy_variant(self) -> int | None:
        return next((v for v, t in enumerate(self.temperatures) if t == 0), None)


@dataclass(frozen=True)
class PlanEntry:
    id: str
    tokens: tuple[int, ...]


def build_plan(target: TargetModel, data_dir: str | Path | None, spec: CorpusSpec) -> list[PlanEntry]:
    """The corpus's ordered prompts (see the module docstring)."""
    from specbench.data.training import training_items

    entries: list[PlanEntry] = []
    for name in spec.sets:
        if name.startswith(SYNTHETIC):
            count = int(name[len(SYNTHETIC):])
            rng = random.Random(f"{spec.seed}/{name}")
            hi = max(4, min(spec.max_prompt_len, 48))
            entries += [PlanEntry(f"{name}:{i}", tuple(rng.randrange(target.config.vocab_size)
                                                       for _ in range(rng.randint(4, hi)))) for i in range(count)]
            continue
        if target.tokenizer is None:
            raise CorpusError(f"target {target.name!r} has no tokenizer, so it cannot read the prompt set {name!r}: "
                              f"use --sets {SYNTHETIC}N (random token prompts) for random targets")
        for pid, text in training_items(name, data_dir):
            ids = target.encode_chat(text)
            if len(ids) <= spec.max_prompt_len:
                entries.append(PlanEntry(pid, tuple(ids)))
    if len({e.id for e in entries}) != len(entries):
        raise CorpusError(f"prompt ids repeat across --sets {','.join(spec.sets)}: name each set once")
    random.Random(spec.seed).shuffle(entries)
    return entries


def plan_digest(plan: Sequence[PlanEntry]) -> str:
    h = hashlib.sha256()
    for e in plan:
        h.update(f"{e.id}\t{','.join(map(str, e.tokens))}\n".encode())
    return h.hexdigest()[:16]


def unit_seed(seed: int, shard: int, batch: int, group: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{shard}/{batch}/{group}".encode()).digest()[:8], "little") >> 1


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


class Corpus:
    """A corpus directory (see the module docstring). `Corpus.open` reads one, `Corpus.create` makes
    or reopens one for a spec."""

    def __init__(self, directory: str | Path, spec: CorpusSpec, digest: str, num_prompts: int) -> None:
        self.dir, self.spec, self.digest, self.num_prompts = Path(directory), spec, digest, num_prompts

    @classmethod
    def open(cls, directory: str | Path) -> "Corpus":
        path = Path(directory) / SPEC_FILE
        if not path.is_file():
            raise CorpusError(f"{str(directory)!r} holds no corpus ({SPEC_FILE} is missing): make one with "
                              f"`specbench corpus generate --out {directory} ...` or stage shards with `specbench corpus add`")
        d = json.loads(path.read_text())
        if d.get("format_version") != FORMAT_VERSION:
            raise CorpusError(f"{str(path)!r} has format_version {d.get('format_version')!r}, expected {FORMAT_VERSION}")
        return cls(directory, CorpusSpec.from_dict(d["spec"]), d["plan_digest"], int(d["num_prompts"]))

    @classmethod
    def create(cls, directory: str | Path, spec: CorpusSpec, digest: str, num_prompts: int) -> "Corpus":
        d = Path(directory)
        if (d / SPEC_FILE).is_file():
            old = cls.open(d)
            if old.spec != spec:
                diff = {k: (v, getattr(spec, k)) for k, v in old.spec.to_dict().items()
                        if v != spec.to_dict()[k]}
                raise CorpusError(f"{str(d)!r} is a corpus made with other settings {diff} (was, asked): use the same "
                                  f"flags (--{next(iter(diff)).replace('_', '-')}) or another --out directory")
            if (old.digest, old.num_prompts) != (digest, num_prompts):
                raise CorpusError(f"{str(d)!r} was planned over other prompts (digest {old.digest}, {old.num_prompts} "
                                  f"prompts; now {digest}, {num_prompts}): is --data the same data directory?")
            return old
        d.mkdir(parents=True, exist_ok=True)
        body = {"format_version": FORMAT_VERSION, "spec": spec.to_dict(), "plan_digest": digest, "num_prompts": num_prompts}
        _atomic_write(d / SPEC_FILE, json.dumps(body, indent=2))
        return cls(d, spec, digest, num_prompts)

    # ---- layout ------------------------------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        return -(-self.num_prompts // self.spec.shard_size)

    def shard_range(self, k: int) -> tuple[int, int]:
        s = self.spec.shard_size
        return k * s, min((k + 1) * s, self.num_prompts)

    def shard_path(self, k: int) -> Path:
        return self.dir / f"shard-{k:05d}.npz"

    def partial_path(self, k: int) -> Path:
        return self.dir / PARTIAL_DIR / f"shard-{k:05d}.jsonl"

    def finished(self) -> list[int]:
        return [k for k in range(self.num_shards) if self.shard_path(k).is_file()]

    def check_target(self, target: TargetModel) -> None:
        if target.fingerprint != self.spec.target_fingerprint or _dtype_name(target) != self.spec.dtype:
            raise CorpusError(f"corpus {str(self.dir)!r} is answered by target {self.spec.target!r} (fingerprint "
                              f"{self.spec.target_fingerprint}, {self.spec.dtype}); the loaded target is "
                              f"{target.fingerprint} in {_dtype_name(target)}: pass the same --target and --dtype")


def _dtype_name(target: TargetModel) -> str:
    return str(target.dtype).removeprefix("torch.")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def open_or_create(directory: str | Path, target: TargetModel, data_dir: str | Path | None, *, sets: Sequence[str],
                   max_prompt_len: int, max_new_tokens: int, temperatures: Sequence[float], seed: int,
                   shard_size: int, sample_seed: int | None = None) -> tuple[Corpus, list[PlanEntry]]:
    """The corpus for these settings (made if absent, checked if present) and its plan."""
    spec = CorpusSpec(target=target.name, target_fingerprint=target.fingerprint, dtype=_dtype_name(target),
                      sets=tuple(sets), max_prompt_len=max_prompt_len, max_new_tokens=max_new_tokens,
                      temperatures=tuple(temperatures), seed=seed, shard_size=shard_size,
                      sample_seed=None if sample_seed == seed else sample_seed)
    plan = build_plan(target, data_dir, spec)
    if not plan:
        raise CorpusError(f"no training prompt of {','.join(sets)} fits --max-prompt-len {max_prompt_len}")
    return Corpus.create(directory, spec, plan_digest(plan), len(plan)), plan


# ---- generation ------------------------------------------------------------------------------------
def shard_batches(plan: Sequence[PlanEntry], lo: int, hi: int, gen_batch: int) -> list[list[int]]:
    """Plan indices of each generation batch of the shard [lo, hi): sorted by prompt length (less padding)."""
    order = sorted(range(lo, hi), key=lambda i: (len(plan[i].tokens), i))
    return [order[s: s + gen_batch] for s in range(0, len(order), gen_batch)]


def generate(target: TargetModel, corpus: Corpus, plan: Sequence[PlanEntry], *, gen_batch: int,
             shards: Iterable[int] | None = None, max_shards: int | None = None, deadline: float | None = None,
             log: Callable[[str], None] | None = None) -> list[int]:
    """Answer the requested shards (default: every unfinished one, in order), at most `max_shards` of
    them, stopping cleanly between units at `deadline` (time.monotonic()). Returns the shards finished
    by this call."""
    corpus.check_target(target)
    if plan_digest(plan) != corpus.digest:
        raise CorpusError(f"the plan built here (digest {plan_digest(plan)}) is not the corpus's ({corpus.digest}): "
                          f"pass the --data directory the corpus was planned from")
    if gen_batch < 1:
        raise CorpusError(f"--gen-batch must be >= 1, got {gen_batch}")
    wanted = list(range(corpus.num_shards)) if shards is None else sorted(set(shards))
    bad = [k for k in wanted if not 0 <= k < corpus.num_shards]
    if bad:
        raise CorpusError(f"--shards {bad} outside the corpus's {corpus.num_shards} shards (0..{corpus.num_shards - 1})")
    todo = [k for k in wanted if not corpus.shard_path(k).is_file()]
    if max_shards is not None:
        todo = todo[:max_shards]
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    done = []
    for k in todo:
        if deadline is not None and time.monotonic() > deadline:
            break
        if generate_shard(target, corpus, plan, k, gen_batch=gen_batch, deadline=deadline, log=say):
            done.append(k)
    return done


def generate_shard(target: TargetModel, corpus: Corpus, plan: Sequence[PlanEntry], k: int, *, gen_batch: int,
                   deadline: float | None = None, log: Callable[[str], None] = print) -> bool:
    """Answer shard k unit by unit (resuming its partial file); True once the shard file is written."""
    from specbench.engine import generate_batch

    spec = corpus.spec
    partial = corpus.partial_path(k)
    partial.parent.mkdir(parents=True, exist_ok=True)
    header, units = _read_partial(partial)
    if header is None:
        header = {"shard": k, "gen_batch": gen_batch, "plan_digest": corpus.digest, "device": str(target.device),
                  "torch": torch.__version__, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _atomic_write(partial, json.dumps(header) + "\n")
    elif header["plan_digest"] != corpus.digest:
        raise CorpusError(f"{str(partial)!r} was started for another plan ({header['plan_digest']}): delete it")
    elif header["gen_batch"] != gen_batch:
        log(f"corpus: shard {k} was started with gen_batch {header['gen_batch']}: finishing it with that batch size")
    lo, hi = corpus.shard_range(k)
    batches = shard_batches(plan, lo, hi, int(header["gen_batch"]))
    groups = spec.groups
    todo = [(b, g) for b in range(len(batches)) for g in range(len(groups)) if (b, g) not in units]
    with open(partial, "a") as f:
        for b, g in todo:
            if deadline is not None and time.monotonic() > deadline:
                log(f"corpus: shard {k} stopped at the deadline ({len(units)}/{len(batches) * len(groups)} units kept "
                    f"in {partial})")
                return False
            temperature, variants = groups[g]
            rows = [list(plan[i].tokens) for _ in variants for i in batches[b]]
            t0 = time.monotonic()
            gen = None
            if temperature > 0:
                gen = torch.Generator(device=target.device).manual_seed(unit_seed(spec.sampling_seed, k, b, g))
            responses = generate_batch(target, rows, spec.max_new_tokens, temperature, gen)
            dt = time.monotonic() - t0
            f.write(json.dumps({"batch": b, "group": g, "seconds": round(dt, 3), "responses": responses}) + "\n")
            f.flush()
            units[(b, g)] = (responses, dt)
            n_tok = sum(len(r) for r in responses)
            log(f"corpus: shard {k} batch {b + 1}/{len(batches)} T={temperature:g}: {len(rows)} responses, {n_tok} tokens "
                f"in {dt:.1f}s ({n_tok / max(dt, 1e-9):.0f} tok/s)")
    _write_shard(target, corpus, plan, k, header, batches, units)
    partial.unlink()
    return True


Units = dict[tuple[int, int], tuple[list[list[int]], float]]  # (batch, group) -> (responses, seconds)


def _read_partial(path: Path) -> tuple[dict | None, Units]:
    """(header, units) of a partial file; a line cut by an interruption is dropped."""
    if not path.is_file():
        return None, {}
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):  # cut mid-line: drop it so appends start on a fresh line
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    lines = [line for line in data.decode().splitlines() if line.strip()]
    if not lines:
        return None, {}
    units = {}
    for line in lines[1:]:
        r = json.loads(line)
        units[(int(r["batch"]), int(r["group"]))] = (r["responses"], float(r["seconds"]))
    return json.loads(lines[0]), units


def _write_shard(target: TargetModel, corpus: Corpus, plan: Sequence[PlanEntry], k: int, header: dict,
                 batches: list[list[int]], units: Units) -> None:
    """Assemble the units into plan order (prompt-major, then variant) and write the shard file."""
    spec = corpus.spec
    lo, hi = corpus.shard_range(k)
    n_var = len(spec.temperatures)
    answers: dict[tuple[int, int], list[int]] = {}
    for (b, g), (responses, _) in units.items():
        variants = spec.groups[g][1]
        rows = [(i, v) for v in variants for i in batches[b]]
        for (i, v), r in zip(rows, responses):
            answers[(i, v)] = r
    prompts = [list(plan[i].tokens) for i in range(lo, hi)]
    responses = [answers[(i, v)] for i in range(lo, hi) for v in range(n_var)]
    dt = token_dtype(target.config.vocab_size)
    meta = {"format_version": FORMAT_VERSION, "spec": spec.to_dict(), "plan_digest": corpus.digest, "shard": k,
            "plan_range": [lo, hi], "prompt_ids": [plan[i].id for i in range(lo, hi)], "gen_batch": header["gen_batch"],
            "device": header["device"], "torch": header["torch"], "started_utc": header["started_utc"],
            "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "prompt_tokens": sum(map(len, prompts)), "response_tokens": sum(map(len, responses)),
            "sequences": len(responses), "seconds": round(sum(dt for _, dt in units.values()), 3),
            "num_prompts": corpus.num_prompts, "eos_token_ids": list(target.eos_token_ids)}
    arrays = {"meta": np.array(json.dumps(meta)),
              "prompt_tokens": np.array([t for p in prompts for t in p], dtype=dt),
              "prompt_offsets": np.cumsum([0] + [len(p) for p in prompts], dtype=np.int64),
              "response_tokens": np.array([t for r in responses for t in r], dtype=dt),
              "response_offsets": np.cumsum([0] + [len(r) for r in responses], dtype=np.int64)}
    tmp = corpus.partial_path(k).with_suffix(".npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(corpus.shard_path(k))


# ---- reading ---------------------------------------------------------------------------------------
def shard_meta(path: str | Path) -> dict[str, Any]:
    with np.load(path, allow_pickle=False) as z:
        return json.loads(str(z["meta"][()]))


def load_shard(path: str | Path) -> tuple[TokenStore, dict[str, Any]]:
    """A shard as a TokenStore (prompt p of the shard = plan entry plan_range[0] + p) and its meta."""
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"][()]))
        arrays = {k: torch.from_numpy(z[k].astype(np.int64 if "offsets" in k else np.int32)) for k in z.files if k != "meta"}
    n_prompts = arrays["prompt_offsets"].numel() - 1
    n_var = len(meta["spec"]["temperatures"])
    store = TokenStore(arrays["prompt_tokens"], arrays["prompt_offsets"], arrays["response_tokens"],
                       arrays["response_offsets"], torch.arange(n_prompts).repeat_interleave(n_var),
                       torch.arange(n_var).repeat(n_prompts))
    return store, meta


def load(corpus: Corpus, shards: Sequence[int] | None = None) -> tuple[TokenStore, torch.Tensor, list[int]]:
    """(every sequence of the given finished shards (default: all finished), the plan index of each of
    the store's prompts [P], the shards read)."""
    ks = corpus.finished() if shards is None else sorted(shards)
    missing = [k for k in ks if not corpus.shard_path(k).is_file()]
    if missing:
        raise CorpusError(f"corpus {str(corpus.dir)!r} lacks shards {missing}: generate them or stage them with "
                          f"`specbench corpus add {corpus.dir} SRC`")
    if not ks:
        raise CorpusError(f"corpus {str(corpus.dir)!r} has no finished shard yet: run `specbench corpus generate`")
    stores, index = [], []
    for k in ks:
        store, meta = load_shard(corpus.shard_path(k))
        _check_meta(corpus, meta, corpus.shard_path(k))
        stores.append(store)
        index.append(torch.arange(*meta["plan_range"]))
    return TokenStore.concat(stores), torch.cat(index), ks


def split_validation(store: TokenStore, plan_index: torch.Tensor, val_prompts: int,
                     val_variant: int | None) -> tuple[TokenStore, TokenStore]:
    """(train, validation): the first `val_prompts` plan entries are held out with all their responses;
    validation keeps one response each (`val_variant`, the greedy one where there is one)."""
    held = plan_index[store.prompt_of] < val_prompts  # [S]
    keep = held & (store.variant == (val_variant or 0))
    return store.select(torch.nonzero(~held)[:, 0]), store.select(torch.nonzero(keep)[:, 0])


def _check_meta(corpus: Corpus, meta: dict[str, Any], where: Path) -> None:
    if meta.get("format_version") != FORMAT_VERSION:
        raise CorpusError(f"{str(where)!r}: shard format {meta.get('format_version')!r}, expected {FORMAT_VERSION}")
    if CorpusSpec.from_dict(meta["spec"]) != corpus.spec or meta["plan_digest"] != corpus.digest:
        raise CorpusError(f"{str(where)!r} belongs to another corpus (spec {meta['spec']}, plan {meta['plan_digest']}) "
                          f"than {str(corpus.dir)!r} ({corpus.spec.to_dict()}, plan {corpus.digest})")
    if tuple(meta["plan_range"]) != corpus.shard_range(int(meta["shard"])):
        raise CorpusError(f"{str(where)!r}: shard {meta['shard']} covers {meta['plan_range']}, the corpus expects "
                          f"{list(corpus.shard_range(int(meta['shard'])))}")


def add(directory: str | Path, sources: Sequence[str | Path], *, replace: bool = False,
        log: Callable[[str], None] = print) -> list[int]:
    """Stage finished shards (files, or directories holding shard-*.npz) into the corpus at
    `directory`, creating it from the first shard's provenance if needed. A shard already there is
    skipped if identical; a different one is an error unless `replace`. Returns the shards added."""
    files: list[Path] = []
    for src in map(Path, sources):
        if src.is_dir():
            files += sorted(src.glob("shard-*.npz"))
        elif src.is_file():
            files.append(src)
        else:
            raise CorpusError(f"{str(src)!r} is neither a shard file nor a directory")
    if not files:
        raise CorpusError(f"no shard-*.npz in {', '.join(map(str, sources))}")
    d = Path(directory)
    added = []
    for path in files:
        meta = shard_meta(path)
        if not (d / SPEC_FILE).is_file():
            spec = CorpusSpec.from_dict(meta["spec"])
            Corpus.create(d, spec, meta["plan_digest"], int(meta["num_prompts"]))
        corpus = Corpus.open(d)
        _check_meta(corpus, meta, path)
        k = int(meta["shard"])
        dest = corpus.shard_path(k)
        if dest.is_file():
            if content_digest(dest) == content_digest(path):
                log(f"corpus: shard {k} already there (identical), skipped")
                continue
            if not replace:
                raise CorpusError(f"{str(dest)!r} exists and differs from {str(path)!r} (generated twice?): pass "
                                  f"--replace to take the new one")
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.copyfile(path, tmp)
        tmp.replace(dest)
        corpus.partial_path(k).unlink(missing_ok=True)
        added.append(k)
    return added


def content_digest(path: str | Path) -> str:
    """sha256 of what a shard holds (prompt ids, tokens, responses), not of when or where it was made."""
    h = hashlib.sha256()
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"][()]))
        h.update(json.dumps([meta["spec"], meta["plan_digest"], meta["shard"], meta["prompt_ids"]]).encode())
        for key in ("prompt_tokens", "prompt_offsets", "response_tokens", "response_offsets"):
            h.update(np.ascontiguousarray(z[key].astype(np.int64)).tobytes())
    return h.hexdigest()


def status(corpus: Corpus) -> dict[str, Any]:
    """What the corpus holds: shards, sequences and tokens (overall and per sampling temperature).
    sequence_tokens = prompt + response tokens summed over sequences (what one epoch runs through the
    target); response_tokens = the labels."""
    spec = corpus.spec
    finished = corpus.finished()
    per_var = [{"temperature": t, "sequences": 0, "response_tokens": 0, "ended_eos": 0} for t in spec.temperatures]
    totals = {"prompts": 0, "sequences": 0, "prompt_tokens": 0, "sequence_tokens": 0, "response_tokens": 0}
    seconds = 0.0
    for k in finished:
        store, meta = load_shard(corpus.shard_path(k))
        lengths = store.response_lengths()
        totals["prompts"] += store.num_prompts
        totals["sequences"] += len(store)
        totals["prompt_tokens"] += int(store.prompt_offsets[-1])
        totals["response_tokens"] += int(lengths.sum())
        totals["sequence_tokens"] += int(store.prompt_lengths().sum() + lengths.sum())
        seconds += float(meta["seconds"])
        last = store.response_tokens[(store.response_offsets[1:] - 1).clamp(min=0)].long()
        ended = torch.isin(last, torch.tensor(meta["eos_token_ids"] or [-1])) & (lengths > 0)
        for v in range(len(spec.temperatures)):
            sel = store.variant == v
            per_var[v]["sequences"] += int(sel.sum())
            per_var[v]["response_tokens"] += int(lengths[sel].sum())
            per_var[v]["ended_eos"] += int((sel & ended).sum())
    partial = {k: len(_read_partial(corpus.partial_path(k))[1]) for k in range(corpus.num_shards)
               if corpus.partial_path(k).is_file() and not corpus.shard_path(k).is_file()}
    return {"dir": str(corpus.dir), "spec": spec.to_dict(), "plan_digest": corpus.digest,
            "plan_prompts": corpus.num_prompts, "shards": corpus.num_shards, "finished_shards": len(finished),
            "finished": finished, "partial_units": partial, **totals, "generation_s": round(seconds, 1),
            "by_temperature": per_var, "bytes": sum(corpus.shard_path(k).stat().st_size for k in finished)}
