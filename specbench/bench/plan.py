"""Expand a `Study` into concrete run configurations, checked against the registries before any
model is loaded, plus the AR baselines every speed-up is measured against."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from specbench.bench.study import Grid, Study, StudyError
from specbench.config import ConfigError, RunConfig, SamplingConfig, SpecConfig
from specbench.drafters import DRAFTERS
from specbench.models import default_target_name
from specbench.registry import RegistryError
from specbench.trees import TREE_POLICIES
from specbench.verify import VERIFIERS


def stable_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Variant:
    """One resolved configuration. `optional`: it came from an optional grid (may be skipped);
    `replay`: measured by exact replay (its rows are keyed apart from decoded ones)."""

    run: RunConfig
    optional: bool = False
    replay: bool = False

    @property
    def key(self) -> str:
        return stable_hash({**self.run.to_dict(), "replay": True} if self.replay else self.run.to_dict())

    @property
    def label(self) -> str:
        s = self.run.spec
        if s.drafter is None:
            return "ar"
        args = [f"{k}={v}" for part in (s.drafter_args, s.tree_args, s.verifier_args) for k, v in sorted(part.items())]
        return f"{s.drafter}/{s.tree}/{s.verifier}/b{s.budget}" + (f" ({', '.join(args)})" if args else "")


@dataclass
class Plan:
    variants: list[Variant]  # AR baselines first, then the grids' configurations, without repeats
    notes: list[str] = field(default_factory=list)


def ar_config(run: RunConfig) -> RunConfig:
    """The AR baseline of `run`: same target, stack, sampling and length, no drafter. Its verifier is
    plain sampling of the target (argmax at T = 0), whatever verifier the SD configuration uses."""
    verifier = "greedy" if run.sampling.greedy else "sample-walk"
    return RunConfig(target=run.target, spec=SpecConfig(drafter=None, tree="chain", verifier=verifier, budget=1),
                     sampling=run.sampling, max_new_tokens=run.max_new_tokens, max_seq_len=run.max_seq_len,
                     device=run.device, dtype=run.dtype, attention=run.attention)


def _lookup(registry: Any, name: str, what: str) -> tuple[Any, str | None]:
    """(component, None) or (None, why it is unavailable)."""
    if name not in registry and "." not in name and ":" not in name:
        return None, f"{what} {name!r} is not registered (registered: {', '.join(registry.names())})"
    try:
        return registry.get(name), None
    except (RegistryError, ImportError, AttributeError) as exc:
        return None, f"{what} {name!r} cannot be imported ({exc})"


def _grid_configs(study: Study, grid: Grid, index: int, notes: list[str]) -> list[RunConfig]:
    out: list[RunConfig] = []
    where = f"study {study.name!r}, grid {index}"
    for drafter, tree, verifier, budget, temperature, drafter_args in itertools.product(
            grid.drafters, grid.trees, grid.verifiers, grid.budgets, grid.temperatures, grid.drafter_args):
        if drafter in (None, "none", "ar", ""):
            continue  # plain AR decoding: every study runs it as the baseline
        problems = []
        drafter_cls, why = _lookup(DRAFTERS, drafter, "drafter")
        if why:
            problems.append(why)
        policy_cls, why = _lookup(TREE_POLICIES, tree, "tree policy")
        if why:
            problems.append(why)
        verifier_cls, why = _lookup(VERIFIERS, verifier, "verifier")
        if why:
            problems.append(why)
        if problems:
            message = "; ".join(problems)
            if not grid.optional:
                raise StudyError(f"{where}: {message}. Register it, or remove it from the study (or override "
                                 f"drafters=/trees=/verifiers=)")
            note = f"skipped optional {drafter} configurations: {message}"
            if note not in notes:
                notes.append(note)
            continue
        if not verifier_cls.lossless and not grid.allow_lossy:
            raise StudyError(f"{where}: verifier {verifier!r} is not lossless; set allow_lossy=True in its Grid to run it")
        try:
            sampling = SamplingConfig(temperature=float(temperature), top_k=study.top_k, top_p=study.top_p, seed=study.seed)
            VERIFIERS.build(verifier, **dict(grid.verifier_args)).check(sampling)
        except ValueError as exc:
            note = f"skipped verifier {verifier!r} at T={temperature}: {exc}"
            if note not in notes:
                notes.append(note)
            continue
        try:
            drafter_cls.check_policy(tree, sampled=verifier_cls.needs_draft_probs and not sampling.greedy)
        except ConfigError as exc:
            note = f"skipped {drafter}/{tree}/{verifier} at T={temperature}: {exc}"
            if note not in notes:
                notes.append(note)
            continue
        try:
            spec = SpecConfig(drafter=drafter, tree=tree, verifier=verifier, budget=budget, drafter_args=dict(drafter_args),
                              tree_args=dict(grid.tree_args), verifier_args=dict(grid.verifier_args),
                              allow_lossy=grid.allow_lossy)
            for target, max_new in itertools.product(study.targets or (default_target_name(),), study.max_new_tokens):
                out.append(RunConfig(target=target, spec=spec, sampling=sampling, max_new_tokens=max_new,
                                     max_seq_len=study.max_seq_len, device=study.device, dtype=study.dtype,
                                     attention=study.attention))
        except ConfigError as exc:
            raise StudyError(f"{where}: {exc}") from None
    if not out and not grid.optional:
        raise StudyError(f"{where} yields no runnable configuration: " + ("; ".join(notes) or "it lists only AR"))
    return out


def plan_study(study: Study) -> Plan:
    """Every configuration of the study, its AR baselines first (none under replay); unavailable
    optional parts become notes."""
    notes: list[str] = []
    configs: list[tuple[RunConfig, bool]] = []
    for index, grid in enumerate(study.grids):
        configs += [(run, grid.optional) for run in _grid_configs(study, grid, index, notes)]
    if study.replay:
        bad = sorted({f"{r.spec.verifier} at T={r.sampling.temperature}" for r, _ in configs
                      if r.spec.verifier != "greedy" or not r.sampling.greedy})
        if bad:
            raise StudyError(f"study {study.name!r} replays (replay=true), which follows the greedy continuation: "
                             f"it needs verifiers=[greedy] and temperatures=[0], not {', '.join(bad)}")
        variants = {v.key: v for v in (Variant(run, optional, replay=True) for run, optional in configs)}
        return Plan(variants=list(variants.values()), notes=notes)
    baselines = [ar_config(run) for run, _ in configs]
    if not configs:  # an all-AR study, or every optional drafter is missing: still measure AR
        temperatures = sorted({float(t) for g in study.grids for t in g.temperatures})
        for target, t, max_new in itertools.product(study.targets or (default_target_name(),), temperatures,
                                                    study.max_new_tokens):
            sampling = SamplingConfig(temperature=t, top_k=study.top_k, top_p=study.top_p, seed=study.seed)
            baselines.append(ar_config(RunConfig(target=target, sampling=sampling, max_new_tokens=max_new,
                                                 max_seq_len=study.max_seq_len, device=study.device,
                                                 dtype=study.dtype, attention=study.attention)))
    variants: dict[str, Variant] = {}
    for v in [Variant(run) for run in baselines] + [Variant(run, optional) for run, optional in configs]:
        variants.setdefault(v.key, v)
    return Plan(variants=list(variants.values()), notes=notes)
