"""The `run`, `table` and `plot` subcommands. `register(subparsers)` adds them to the `specbench`
command; `python -m specbench.bench.cli run ...` works on its own too."""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from specbench.bench.store import RESULTS_FILE, ResultsError
from specbench.bench.study import StudyError, load_study
from specbench.bench.table import FORMATS, SPREADS, make_table
from specbench.cli import UsageError, add_threads_arg, flag_message, set_decode_threads
from specbench.config import ConfigError
from specbench.data import DATA_ENV, DataError
from specbench.registry import RegistryError

USER_ERRORS = (StudyError, DataError, ConfigError, ResultsError, RegistryError, FileNotFoundError)


def _user_errors(command: str) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Bad input prints one line that says what to do (no traceback) and exits with status 2."""
    def wrap(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(handler)
        def run(args: argparse.Namespace) -> int:
            from specbench.models.loader import ModelLoadError

            try:
                return handler(args)
            except (*USER_ERRORS, ModelLoadError, UsageError) as exc:
                print(f"specbench {command}: error: {flag_message(exc, args)}", file=sys.stderr)
                return 2
        return run
    return wrap


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


@_user_errors("run")
def cmd_run(args: argparse.Namespace) -> int:
    from specbench.bench.plan import plan_study
    from specbench.bench.runner import default_out_dir, run_study

    overrides = list(args.overrides)
    if args.device:
        overrides.append(f"device={args.device}")
    if args.dtype:
        overrides.append(f"dtype={args.dtype}")
    study = load_study(args.study).with_overrides(overrides)
    if args.dry_run:
        plan = plan_study(study)
        for note in plan.notes:
            print(f"note: {note}")
        for v in plan.variants:
            print(f"{v.run.target}  {v.label}  T={v.run.sampling.temperature}  max_new_tokens={v.run.max_new_tokens}")
        datasets = [d.label + ("" if d.n is None else f"[:{d.n}]") for d in study.datasets]
        print(f"{len(plan.variants)} configurations x datasets {datasets}")
        return 0
    out = Path(args.out) if args.out else default_out_dir(study)
    pending = [set_decode_threads(args.threads, study.device)]

    def log(message: str) -> None:  # the threads line goes out with the run's first line (a bad study: one line)
        for line in filter(None, pending):
            tqdm.write(line, file=sys.stderr)
        pending.clear()
        tqdm.write(message, file=sys.stderr)

    start = time.perf_counter()
    try:
        result = run_study(study, data_dir=args.data_dir, out_dir=out, progress=not args.no_progress, log=log)
    except KeyboardInterrupt:
        print(f"\ninterrupted: every finished generation is saved in {out / RESULTS_FILE}; rerun the same command "
              f"to resume", file=sys.stderr)
        return 130
    wall = time.perf_counter() - start
    t = study.table
    print(make_table([result.results], rows=t.rows, cols=t.cols, values=t.values, keys=result.keys))
    skipped = f", {result.skipped} skipped" if result.skipped else ""
    print(f"\n{result.written} new of {result.total} generations{skipped} in {wall:.0f} s; results: {result.results}")
    for note in result.notes:
        print(f"note: {note}")
    return 0


@_user_errors("table")
def cmd_table(args: argparse.Namespace) -> int:
    print(make_table(args.results, rows=_csv(args.rows), cols=_csv(args.cols), values=_csv(args.value),
                     fmt=args.format, spread=args.spread, where=args.where), end="" if args.format == "csv" else "\n")
    return 0


@_user_errors("plot")
def cmd_plot(args: argparse.Namespace) -> int:
    from specbench.bench.plots import make_plots
    from specbench.bench.store import results_path

    out = Path(args.out) if args.out else results_path(args.results[0]).parent / "plots"
    for path in make_plots(args.results, out, tuple(args.where)):
        print(path)
    return 0


def register(subparsers: Any) -> None:
    """Add `run`, `table` and `plot` to an argparse subparsers object; each sets `func(args) -> int`."""
    run = subparsers.add_parser("run", help="run (or resume) a study file, then print its table",
                                description="Run a study (experiments/NAME.py) and print its table. Finished "
                                            "generations are saved at once; rerunning resumes.")
    run.add_argument("study", help="a study file, e.g. experiments/quickstart.py")
    run.add_argument("overrides", nargs="*", help="key=value overrides: budgets=[16,32] n=5 drafters=[ngram] ...")
    run.add_argument("--data-dir", default=None, help=f"benchmark data directory (default: ${DATA_ENV})")
    run.add_argument("--out", default=None, help="run directory (default: runs/<study name>)")
    run.add_argument("--device", default=None, help="cpu or cuda (overrides the study's)")
    run.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"))
    add_threads_arg(run)
    run.add_argument("--dry-run", action="store_true", help="list the configurations and exit")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)

    table = subparsers.add_parser("table", help="pivot table of results (mean ± spread over prompts)")
    table.add_argument("results", nargs="+", help="results.jsonl files or run directories")
    table.add_argument("--rows", default="drafter,tree,budget", help="comma-separated row columns")
    table.add_argument("--cols", default="dataset", help="comma-separated column columns ('' for none)")
    table.add_argument("--value", default="tau", help="comma-separated values, e.g. tau,speedup_decode,speedup_e2e")
    table.add_argument("--format", default="markdown", choices=FORMATS)
    table.add_argument("--spread", default="std", choices=SPREADS)
    table.add_argument("--where", action="append", default=[], help="filter column=value[,value] (repeatable)")
    table.set_defaults(func=cmd_table)

    plot = subparsers.add_parser("plot", help="PNG plots of results (tau vs budget, speed-ups, acceptance by depth)")
    plot.add_argument("results", nargs="+", help="results.jsonl files or run directories")
    plot.add_argument("--out", default=None, help="output directory (default: <run directory>/plots)")
    plot.add_argument("--where", action="append", default=[], help="filter column=value[,value] (repeatable)")
    plot.set_defaults(func=cmd_plot)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specbench", description="specbench experiment harness")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
