"""Run a study: every (configuration, dataset item, turn) once, each row appended to the results
file the moment it finishes, already-finished keys skipped, so an interrupted run resumes.

Fairness: the target is loaded once per (target, device, dtype, attention) and each configuration
gets one `SpecDecoder` (its KV cache allocated once) with a short throwaway warm-up generation
before anything is timed. Configurations are interleaved item by item (AR, then every SD
configuration, on the same prompt) so a machine whose load drifts slows all of them alike.

A replay study (`Study.replay`) runs its units by exact replay instead: per prompt one greedy
reference, then every configuration replayed on it through the engine's reference mode.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import torch
from tqdm import tqdm

from specbench.bench.plan import Plan, Variant, ar_config, plan_study, stable_hash
from specbench.bench.provenance import provenance
from specbench.bench.replay import ReplayResult, build_references, replay, replay_decoder
from specbench.bench.store import RESULTS_FILE, ResultsStore
from specbench.bench.study import DatasetSpec, Study
from specbench.config import ConfigError
from specbench.data import Prompt, load_dataset, turn_prompt_ids
from specbench.drafters import DRAFTERS
from specbench.drafters.base import Drafter
from specbench.engine import GenerationResult, SpecDecoder
from specbench.models import load_target
from specbench.models.target import TargetModel
from specbench.trees import TREE_POLICIES

T = TypeVar("T")


def default_out_dir(study: Study) -> Path:
    return Path("runs") / study.name


@dataclass(frozen=True)
class Unit:
    """One generation: a configuration on one turn of one dataset item."""

    variant: Variant
    dataset: DatasetSpec
    item: Prompt
    index: int  # position of the item in its dataset
    turn: int

    @property
    def key(self) -> str:
        return unit_key(self.variant, self.dataset, self.item.id, self.turn)

    @property
    def baseline_key(self) -> str:
        return unit_key(Variant(ar_config(self.variant.run)), self.dataset, self.item.id, self.turn)


def unit_key(variant: Variant, dataset: DatasetSpec, item_id: str, turn: int) -> str:
    return stable_hash({"config": variant.key, "dataset": dataset.identity, "item": item_id, "turn": turn})


def group_key(variant: Variant) -> tuple[str, str, str, str]:
    r = variant.run
    return (r.target, r.device, r.dtype, r.attention)


def iter_units(plan: Plan, datasets: list[tuple[DatasetSpec, list[Prompt]]]) -> Iterator[Unit]:
    """Units in run order: per target group, per item and turn, every configuration."""
    groups: dict[tuple[str, str, str, str], list[Variant]] = {}
    for v in plan.variants:
        groups.setdefault(group_key(v), []).append(v)
    for variants in groups.values():
        for spec, items in datasets:
            for index, item in enumerate(items):
                for turn in range(len(item.turns)):
                    for v in variants:
                        yield Unit(v, spec, item, index, turn)


@dataclass
class RunResult:
    results: Path
    total: int  # units the study has
    written: int  # rows written by this call
    skipped: int  # generations of optional configurations that could not be built
    keys: set[str] = field(default_factory=set)  # row keys of this study (a table of just this study)
    notes: list[str] = field(default_factory=list)


class RunningStats:
    """What the progress bar shows: mean tau of the SD rows and the last row's decode tok/s."""

    def __init__(self) -> None:
        self.tau_sum, self.sd_rows, self.last_tok_s = 0.0, 0, 0.0

    def add(self, row: dict[str, Any]) -> None:
        if row["drafter"] != "ar":
            self.tau_sum += row["tau"]
            self.sd_rows += 1
        self.last_tok_s = row.get("decode_tok_s", 0.0)

    def text(self, label: str) -> str:
        tau = f"{self.tau_sum / self.sd_rows:.2f}" if self.sd_rows else "-"
        speed = f" tok/s={self.last_tok_s:.1f}" if self.last_tok_s else ""
        return f"tau={tau}{speed} [{label}]"


def item_seed(study: Study, unit: Unit) -> int:
    """Per-item sampling seed: every prompt draws fresh randomness, reproducibly."""
    return int(stable_hash({"seed": study.seed, "dataset": unit.dataset.identity, "item": unit.item.id,
                            "turn": unit.turn})[:15], 16)


def unit_fields(study: Study, unit: Unit, prov: dict[str, Any]) -> dict[str, Any]:
    """The columns every row has: the configuration, the item and where it ran."""
    run, spec = unit.variant.run, unit.variant.run.spec
    is_ar = spec.drafter is None
    return {
        "key": unit.key,
        "study": study.name,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "target": run.target,
        "drafter": "ar" if is_ar else spec.drafter,
        "tree": "-" if is_ar else spec.tree,
        "verifier": spec.verifier,
        "budget": 0 if is_ar else spec.budget,
        "drafter_args": stable_json(spec.drafter_args),
        "tree_args": stable_json(spec.tree_args),
        "temperature": run.sampling.temperature,
        "max_new_tokens": run.max_new_tokens,
        "device": run.device,
        "dtype": run.dtype,
        "dataset": unit.dataset.label,
        "item_id": unit.item.id,
        "item_index": unit.index,
        "turn": unit.turn,
        "config": run.to_dict(),
        "config_key": unit.variant.key,
        "dataset_spec": unit.dataset.identity,
        "provenance": prov,
    }


def make_row(study: Study, unit: Unit, target: TargetModel, result: GenerationResult, seed: int,
             prov: dict[str, Any]) -> dict[str, Any]:
    return {
        **unit_fields(study, unit, prov),
        "baseline_key": unit.baseline_key,
        "item_seed": seed,
        **result.stats.summary(),
        "process_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "output_ids": list(result.tokens),
        "output_text": target.decode(result.tokens) if target.tokenizer is not None else None,
    }


class CollectorTime:
    """Seconds Python's cyclic garbage collector ran inside the `with` block (`gc.callbacks`): a row's
    host time that no stage accounts for may be the collector's, and the row says how much was."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None

    def __enter__(self) -> "CollectorTime":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def median_by(items: list[T], key: Callable[[T], float]) -> T:
    """The item of median `key` (the lower middle of an even count): of timing repeats, the run one host
    stall (a collector pass, a page fault) in another repeat cannot move."""
    return sorted(items, key=key)[(len(items) - 1) // 2]


def repeat_fields(runs: list[GenerationResult]) -> dict[str, Any]:
    """What the row says about its repeats: every decode time, and whether they emitted the same tokens
    (sampling is seeded per item, so a repeat that did not is non-determinism worth seeing)."""
    return {"timing_repeats": len(runs), "decode_s_repeats": [r.stats.decode_time for r in runs],
            "repeats_agree": all(r.tokens == runs[0].tokens for r in runs)}


def stable_json(obj: Any) -> str:
    return json.dumps(dict(obj), sort_keys=True, default=str)


def run_study(study: Study, *, data_dir: str | Path | None = None, out_dir: str | Path | None = None,
              progress: bool = True, on_row: Callable[[dict[str, Any]], None] | None = None,
              log: Callable[[str], None] | None = None) -> RunResult:
    """Run (or resume) `study`; rows go to OUT/results.jsonl (OUT defaults to runs/<study name>)."""
    log = log or (lambda msg: tqdm.write(msg, file=sys.stderr))
    plan = plan_study(study)
    for note in plan.notes:
        log(f"note: {note}")
    datasets = [(spec, load_dataset(spec.name, data_dir, spec.n, **dict(spec.args))) for spec in study.datasets]
    units = list(iter_units(plan, datasets))
    out = Path(out_dir) if out_dir is not None else default_out_dir(study)
    notes = list(plan.notes)
    written = skipped = 0
    with ResultsStore(out / RESULTS_FILE) as store:
        if store.dropped_partial_line:
            log(f"note: dropped a partially written last line of {store.path} (its item will be rerun)")
        done = sum(u.key in store for u in units)
        what = "configurations replayed" if study.replay else "configurations (AR baselines included)"
        log(f"{study.name}: {len(plan.variants)} {what}, {len(units)} generations, {done} already in {store.path}")
        bar = tqdm(total=len(units), initial=done, disable=not progress, unit="gen", dynamic_ncols=True, file=sys.stderr)
        stats = RunningStats()
        try:
            for gkey in dict.fromkeys(group_key(u.variant) for u in units):
                todo = [u for u in units if group_key(u.variant) == gkey and u.key not in store]
                if todo:
                    run_group = _run_replay_group if study.replay else _run_group
                    group_written, group_skipped = run_group(study, todo, store, bar, stats, on_row, log, notes)
                    written, skipped = written + group_written, skipped + group_skipped
        finally:
            bar.close()
    return RunResult(results=out / RESULTS_FILE, total=len(units), written=written, skipped=skipped,
                     keys={u.key for u in units}, notes=notes)


def _run_group(study: Study, todo: list[Unit], store: ResultsStore, bar: tqdm, stats: RunningStats,
               on_row: Callable[[dict[str, Any]], None] | None, log: Callable[[str], None],
               notes: list[str]) -> tuple[int, int]:
    """Units of one (target, device, dtype, attention): the target is loaded once. Returns (rows
    written, units skipped because an optional configuration could not be built)."""
    first = todo[0].variant.run
    target = load_target(first.target, device=first.device, dtype=first.dtype, attention=first.attention)
    prov = provenance(first.device)
    decoders: dict[str, SpecDecoder | None] = {}
    written = skipped = 0
    try:
        for unit in todo:
            vkey = unit.variant.key
            if vkey in decoders and decoders[vkey] is None:
                continue  # an optional configuration that could not be built
            answers = [store.rows[unit_key(unit.variant, unit.dataset, unit.item.id, t)]["output_ids"]
                       for t in range(unit.turn)]
            prompt_ids = turn_prompt_ids(target, unit.item, unit.turn, answers)
            seed = item_seed(study, unit)
            sampling = dataclasses.replace(unit.variant.run.sampling, seed=seed)
            if vkey not in decoders:
                decoders[vkey] = _build_decoder(study, unit.variant, target, prompt_ids, sampling, log, notes)
                if decoders[vkey] is None:
                    lost = sum(1 for u in todo if u.variant.key == vkey)
                    skipped += lost
                    bar.total -= lost
                    bar.refresh()
                    continue
            decoder = decoders[vkey]
            assert decoder is not None
            timed: list[tuple[GenerationResult, float]] = []  # (run, collector seconds inside it)
            try:
                for _ in range(study.timing_repeats):
                    with CollectorTime() as gc_time:
                        result = decoder.generate(prompt_ids, unit.variant.run.max_new_tokens, sampling)
                    timed.append((result, gc_time.seconds))
            except ConfigError as exc:
                raise ConfigError(f"{unit.dataset.label} item {unit.item.id!r} turn {unit.turn} "
                                  f"({unit.variant.label}): {exc}", keys=exc.keys) from None
            kept, gc_s = median_by(timed, key=lambda t: t[0].stats.decode_time)
            _record(make_row(study, unit, target, kept, seed, prov) | repeat_fields([r for r, _ in timed])
                    | {"gc_s": gc_s}, unit, store, bar, stats, on_row)
            written += 1
    finally:
        decoders.clear()
        del target
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return written, skipped


def _record(row: dict[str, Any], unit: Unit, store: ResultsStore, bar: tqdm, stats: RunningStats,
            on_row: Callable[[dict[str, Any]], None] | None) -> None:
    """A finished unit's row: to the results file (at once), the progress bar and `on_row`."""
    store.append(row)
    stats.add(row)
    bar.set_postfix_str(stats.text(unit.variant.label), refresh=False)
    bar.update(1)
    if on_row is not None:
        on_row(row)


def _run_replay_group(study: Study, todo: list[Unit], store: ResultsStore, bar: tqdm, stats: RunningStats,
                      on_row: Callable[[dict[str, Any]], None] | None, log: Callable[[str], None],
                      notes: list[str]) -> tuple[int, int]:
    """Units of one target group by exact replay. Every decoder is built first (the reference carries
    the taps of all drafters), with one drafter object per (drafter, drafter_args), so what it
    precomputes along a reference serves all its trees and budgets (the host walk); on CUDA, where the
    replay is the graphed device round, one drafter per decoder. Returns (written, skipped)."""
    first = todo[0].variant.run
    target = load_target(first.target, device=first.device, dtype=first.dtype, attention=first.attention)
    prov = provenance(first.device)
    drafters: dict[str, Drafter] = {}
    decoders: dict[str, SpecDecoder] = {}
    share = target.device.type != "cuda"  # graphed replays (CUDA) hold their drafter's buffers: one drafter each
    for variant in {u.variant.key: u.variant for u in todo}.values():
        spec = variant.run.spec
        dkey = stable_json({"drafter": spec.drafter, "args": stable_json(spec.drafter_args)}) if share else variant.key
        try:
            if dkey not in drafters:
                drafters[dkey] = DRAFTERS.build(spec.drafter, target, **dict(spec.drafter_args))
            policy = TREE_POLICIES.build(spec.tree, **dict(spec.tree_args))
            decoders[variant.key] = replay_decoder(drafters[dkey], policy, spec.budget, variant.run.max_seq_len)
        except Exception as exc:
            _skip_optional(variant, exc, notes, log)
    runnable = [u for u in todo if u.variant.key in decoders]
    bar.total -= len(todo) - len(runnable)
    taps = sorted({t for d in decoders.values() for t in d.drafter.taps})  # type: ignore[union-attr]
    prompts: dict[tuple[str, str, int, int], list[Unit]] = {}
    for unit in runnable:
        prompts.setdefault((unit.dataset.label, unit.item.id, unit.turn, unit.variant.run.max_new_tokens), []).append(unit)
    written = 0
    for units in prompts.values():
        head = units[0]
        answers = [store.rows[unit_key(head.variant, head.dataset, head.item.id, t)]["output_ids"] for t in range(head.turn)]
        prompt_ids = turn_prompt_ids(target, head.item, head.turn, answers)
        t0 = time.perf_counter()
        ref = build_references(target, [prompt_ids], head.variant.run.max_new_tokens, taps, batch_size=1)[0]
        reference_s = time.perf_counter() - t0
        for unit in units:
            decoder = decoders[unit.variant.key]
            t0 = time.perf_counter()
            res = replay(decoder.drafter, ref, decoder.policy, decoder.spec.budget,  # type: ignore[arg-type]
                         unit.variant.run.max_new_tokens, decoder=decoder)
            row = replay_row(study, unit, res, ref.tf_mismatch, time.perf_counter() - t0, reference_s, prov)
            _record(row, unit, store, bar, stats, on_row)
            written += 1
    return written, len(todo) - len(runnable)


def replay_row(study: Study, unit: Unit, res: ReplayResult, tf_mismatch: int, replay_s: float, reference_s: float,
               prov: dict[str, Any]) -> dict[str, Any]:
    return {
        **unit_fields(study, unit, prov),
        "mode": "replay",
        "tau": res.tau,
        "rounds": len(res.accepted),
        "new_tokens": len(res.output),
        "mean_tree_size": sum(res.tree_sizes) / len(res.tree_sizes) if res.tree_sizes else 0.0,
        "accepted_hist": {str(k): v for k, v in sorted(Counter(res.accepted).items())},
        "tf_mismatch": tf_mismatch,  # teacher-forced near-tie positions of the reference
        "ref_exhausted": res.ref_exhausted,  # rounds whose walk reached the end of the reference
        "replay_s": round(replay_s, 4),
        "reference_s": round(reference_s, 4),  # the prompt's reference (shared by its configurations)
        "output_ids": list(res.output),
    }


def _skip_optional(variant: Variant, exc: Exception, notes: list[str], log: Callable[[str], None]) -> None:
    """A configuration that cannot be built: re-raise unless it is optional, else note that it is skipped."""
    if not variant.optional:
        raise exc
    note = f"skipped {variant.label} (optional): cannot build it: {type(exc).__name__}: {exc}"
    notes.append(note)
    log(f"note: {note}")


def _build_decoder(study: Study, variant: Variant, target: TargetModel, prompt_ids: list[int], sampling: Any,
                   log: Callable[[str], None], notes: list[str]) -> SpecDecoder | None:
    """One decoder per configuration, warmed up; None (with a note) if an optional one cannot be built."""
    try:
        decoder = SpecDecoder(target, variant.run.spec, max_seq_len=variant.run.max_seq_len)
    except Exception as exc:
        _skip_optional(variant, exc, notes, log)
        return None
    if study.warmup_tokens > 0:
        decoder.generate(prompt_ids, min(study.warmup_tokens, variant.run.max_new_tokens), sampling)
    return decoder
