"""A study: a grid over registry names and values, declared in a small Python file.

    # experiments/my_study.py
    from specbench.bench import DatasetSpec, Grid, Study
    STUDY = Study(name="my_study",
                  grids=(Grid(drafters=("ngram", "self"), budgets=(4, 8)),),
                  datasets=(DatasetSpec("gsm8k", n=20),))

`specbench run experiments/my_study.py budgets=[16,32] n=5` overrides fields. Each `Grid` is a
product over its axes; a study is the union of its grids, crossed with the study-wide axes (targets,
datasets, max_new_tokens). The AR baseline of every target/sampling/length the grids use is added by
the runner, so speed-ups are always measured against the same stack in the same run.

`replay=True` measures tau alone by exact replay (T = 0, greedy verifier; `bench/replay.py`): one
greedy reference per prompt, shared by every configuration, replayed through the engine's reference
mode; no AR baseline, no timings of the decode loop. Much cheaper on many prompts.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from specbench.config import ConfigError, parse_value


class StudyError(ValueError):
    """A study file or override is malformed, or names a component that does not exist."""


def as_tuple(value: Any) -> tuple[Any, ...]:
    if isinstance(value, tuple):
        return value
    if isinstance(value, list):
        return tuple(value)
    return (value,)


@dataclass(frozen=True)
class DatasetSpec:
    """A registered dataset name (or jsonl:PATH), the first `n` items (None = all), loader args."""

    name: str
    n: int | None = None
    args: Mapping[str, Any] = field(default_factory=dict)
    alias: str | None = None  # the name tables show (default: derived from name and args)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise StudyError(f"a dataset name must be a non-empty string, got {self.name!r}")
        if self.n is not None and (not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1):
            raise StudyError(f"dataset {self.name!r}: n must be an integer >= 1 or None (all), got {self.n!r}")

    @property
    def identity(self) -> dict[str, Any]:
        """What makes two specs the same data (n excluded: a larger n only adds items)."""
        return {"name": self.name, "args": dict(self.args)}

    @property
    def label(self) -> str:
        if self.alias:
            return self.alias
        if self.name.startswith("jsonl:"):  # the file's name; its field mapping is in `identity`
            return f"jsonl:{Path(self.name[len('jsonl:'):]).name}"
        args = ",".join(f"{k}={v}" for k, v in sorted(self.args.items()))
        return f"{self.name}({args})" if args else self.name


@dataclass(frozen=True)
class Grid:
    """Every combination of these axes is one speculative-decoding configuration.

    optional=True: a configuration whose drafter or tree policy is not registered, or whose drafter
    cannot be built (e.g. its weights are missing), is skipped with a printed note instead of
    stopping the study. Combinations the components declare incompatible (a drafter's `policies`,
    a verifier that rejects the temperature) are always skipped with a note.
    """

    drafters: tuple[str | None, ...] = (None,)
    trees: tuple[str, ...] = ("chain",)
    verifiers: tuple[str, ...] = ("greedy",)
    budgets: tuple[int, ...] = (8,)
    temperatures: tuple[float, ...] = (0.0,)
    drafter_args: tuple[Mapping[str, Any], ...] = ({},)
    tree_args: Mapping[str, Any] = field(default_factory=dict)
    verifier_args: Mapping[str, Any] = field(default_factory=dict)
    allow_lossy: bool = False
    optional: bool = False

    def __post_init__(self) -> None:
        for name in ("drafters", "trees", "verifiers", "budgets", "temperatures", "drafter_args"):
            values = as_tuple(getattr(self, name))
            if not values:
                raise StudyError(f"Grid.{name} is empty; give at least one value")
            object.__setattr__(self, name, values)
        for b in self.budgets:
            if not isinstance(b, int) or isinstance(b, bool) or b < 1:
                raise StudyError(f"Grid.budgets must hold integers >= 1 (draft nodes, root excluded), got {b!r}")
        for t in self.temperatures:
            if not isinstance(t, (int, float)) or isinstance(t, bool) or t < 0:
                raise StudyError(f"Grid.temperatures must hold numbers >= 0 (0 = greedy), got {t!r}")
        for a in (*self.drafter_args, self.tree_args, self.verifier_args):
            if not isinstance(a, Mapping):
                raise StudyError(f"Grid drafter_args entries, tree_args and verifier_args must be mappings, got {a!r}")


@dataclass(frozen=True)
class TableSpec:
    """The table printed when a run finishes (the same options as `specbench table`)."""

    rows: tuple[str, ...] = ("drafter", "tree", "budget")
    cols: tuple[str, ...] = ("dataset",)
    values: tuple[str, ...] = ("tau", "speedup_decode")

    def __post_init__(self) -> None:
        for name in ("rows", "cols", "values"):
            object.__setattr__(self, name, as_tuple(getattr(self, name)))


@dataclass(frozen=True)
class Study:
    """A named set of grids run on datasets. targets=() means the default target
    ($SPECBENCH_TARGET, else smollm2-135m)."""

    name: str
    grids: tuple[Grid, ...]
    datasets: tuple[DatasetSpec, ...]
    targets: tuple[str, ...] = ()
    max_new_tokens: tuple[int, ...] = (128,)
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_seq_len: int = 2048
    device: str = "cpu"
    dtype: str = "float32"
    attention: str = "auto"
    warmup_tokens: int = 8
    timing_repeats: int = 1  # decode each prompt this many times; the row keeps the median-time run's stats
    replay: bool = False  # tau by exact replay instead of timed decoding (module docstring)
    table: TableSpec = field(default_factory=TableSpec)
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise StudyError(f"Study.name must be a non-empty string without '/', got {self.name!r}")
        for name in ("grids", "datasets", "targets", "max_new_tokens"):
            object.__setattr__(self, name, as_tuple(getattr(self, name)))
        object.__setattr__(self, "datasets", tuple(DatasetSpec(d) if isinstance(d, str) else d for d in self.datasets))
        if not self.grids or not all(isinstance(g, Grid) for g in self.grids):
            raise StudyError(f"study {self.name!r}: grids must be a non-empty tuple of Grid(...)")
        if not self.datasets or not all(isinstance(d, DatasetSpec) for d in self.datasets):
            raise StudyError(f"study {self.name!r}: datasets must be a non-empty tuple of DatasetSpec(...) or names")
        labels = [d.label for d in self.datasets]
        if len(set(labels)) != len(labels):
            raise StudyError(f"study {self.name!r} lists a dataset twice: {labels} "
                             f"(give DatasetSpec(alias=...) to tell them apart)")
        for m in self.max_new_tokens:
            if not isinstance(m, int) or isinstance(m, bool) or m < 1:
                raise StudyError(f"study {self.name!r}: max_new_tokens must hold integers >= 1, got {m!r}")
        if not isinstance(self.warmup_tokens, int) or self.warmup_tokens < 0:
            raise StudyError(f"study {self.name!r}: warmup_tokens must be an integer >= 0, got {self.warmup_tokens!r}")
        if not isinstance(self.timing_repeats, int) or isinstance(self.timing_repeats, bool) or self.timing_repeats < 1:
            raise StudyError(f"study {self.name!r}: timing_repeats must be an integer >= 1, got {self.timing_repeats!r}")
        if not isinstance(self.replay, bool):
            raise StudyError(f"study {self.name!r}: replay must be true or false, got {self.replay!r}")
        if not isinstance(self.table, TableSpec):
            raise StudyError(f"study {self.name!r}: table must be a TableSpec(...)")

    def with_overrides(self, overrides: list[str]) -> Study:
        return apply_study_overrides(self, overrides)


STUDY_KEYS = tuple(f.name for f in dataclasses.fields(Study) if f.name not in ("grids", "table"))
GRID_KEYS = tuple(f.name for f in dataclasses.fields(Grid))


def apply_study_overrides(study: Study, overrides: list[str]) -> Study:
    """`key=value` (YAML values): a Study field, a Grid field (set in every grid), or `n` (items per
    dataset). `datasets=[gsm8k,mt_bench]` keeps the first dataset's n unless `n=` is given too."""
    for item in overrides:
        if "=" not in item:
            raise StudyError(f"override {item!r} is not of the form key=value (e.g. budgets=[16,32] or n=5)")
        key, _, raw = item.partition("=")
        key = key.strip()
        value = parse_value(raw)
        try:
            if key == "n":
                study = dataclasses.replace(study, datasets=tuple(dataclasses.replace(d, n=value) for d in study.datasets))
            elif key == "datasets":
                n = study.datasets[0].n
                study = dataclasses.replace(study, datasets=tuple(
                    DatasetSpec(d, n=n) if isinstance(d, str) else d for d in as_tuple(value)))
            elif key in STUDY_KEYS:
                study = dataclasses.replace(study, **{key: value})
            elif key in GRID_KEYS:
                if key == "drafter_args" and isinstance(value, Mapping):
                    value = (value,)
                study = dataclasses.replace(study, grids=tuple(dataclasses.replace(g, **{key: value}) for g in study.grids))
            else:
                raise StudyError(f"unknown override key {key!r}; study keys: {', '.join(STUDY_KEYS)}; grid keys (set in "
                                 f"every grid): {', '.join(GRID_KEYS)}; and n (items per dataset)")
        except (TypeError, ConfigError) as exc:
            raise StudyError(f"override {item!r}: {exc}") from None
    return study


def load_study(path: str | Path) -> Study:
    """Import a study file and return its module-level `STUDY`."""
    p = Path(path)
    if not p.is_file():
        raise StudyError(f"study file {str(p)!r} does not exist (studies live in experiments/, e.g. experiments/quickstart.py)")
    if p.suffix != ".py":
        raise StudyError(f"study file {str(p)!r} must be a Python file declaring STUDY = Study(...)")
    spec = importlib.util.spec_from_file_location(f"specbench_study_{p.stem}", p)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise StudyError(f"study file {str(p)!r} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # the file's own code failed: report it with the file's name
        raise StudyError(f"study file {str(p)!r} failed while loading: {type(exc).__name__}: {exc}") from exc
    study = getattr(module, "STUDY", None)
    if study is None:
        raise StudyError(f"study file {str(p)!r} defines no STUDY: declare `STUDY = Study(...)` at module level "
                         f"(see experiments/quickstart.py)")
    if not isinstance(study, Study):
        raise StudyError(f"study file {str(p)!r}: STUDY is a {type(study).__name__}, not a specbench.bench.Study")
    return study
