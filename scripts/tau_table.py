"""tau at T = 0 of the DFlash-family heads beside ngram and self (and eagle3), by exact replay: the
multi-process fill of experiments/tau_table.py's table (the same configurations and tau per prompt) for
GPU sessions, with what the harness does not do: N shard processes merged into one file (--parallel),
a time budget (--minutes), a second machine from the other end (--reverse), batched references
(--ref-batch) and trained head directories under labels (--heads, for scripts/tau_vs_tokens.py and
scripts/ablation_table.py). Its rows are this script's own format (docs/measurements/ keeps a table).

    python scripts/tau_table.py --data ../shared/data --out results/tau_table.jsonl            # run / resume
    python scripts/tau_table.py --out results/tau_table.jsonl --table-only                     # print the table
    python scripts/tau_table.py --out docs/measurements/tau_table_smollm2-135m.jsonl.gz --table-only  # the shipped heads' table
    python scripts/tau_table.py --out T.jsonl --table-only --compare 'dflash/ddtree - jetspec/ddtree'  # paired

For every prompt (the first --n items of GSM8K test, MATH-500, MBPP test, HumanEval; the 80 MT-Bench
first turns): the greedy continuation (max_new_tokens, fp32) and one teacher-forced pass are computed
once, then every drafter / tree policy / budget is replayed on them (specbench.bench.replay: the same
accepted count per round as the decode loop). One JSONL row per (prompt, configuration), appended as
each prompt finishes: rerun the same command to resume. Prompts are taken round-robin over the
datasets, so a partial run covers every dataset.

Heads load from specbench/heads/<drafter>-<target>/ (or --heads-dir DIR/<drafter>/); a drafter without
a head is skipped with a message. `--heads LABEL=DIR,...` replaces them with any trained head directories
(snapshots, ablation heads): each is replayed under its drafter's trees (from its config.json) and its rows
carry LABEL as `drafter` (and the drafter's name as `kind`); ngram and self are added with --baselines.
`--drafter-arg LABEL:KEY=VALUE` builds one label's drafter with an argument, e.g. a shipped head under a
second label with shorter blocks (block_size=8: what a block-8 head's depth cap costs, on the same head).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

DATASETS = ("gsm8k", "math500", "mbpp", "humaneval", "mt_bench")
HEAD_CONFIGS = [("dflash", "chain"), ("dflash", "ddtree"), ("jetspec", "accum-logp"), ("jetspec", "ddtree"),
                ("jetspec-tree", "ddtree")]


def parse_heads(text: str | None) -> dict[str, Path]:
    """"a=DIR1,b=DIR2" -> {label: dir}."""
    out: dict[str, Path] = {}
    for item in (x for x in (text or "").split(",") if x.strip()):
        label, sep, directory = item.partition("=")
        if not sep or not label.strip():
            raise SystemExit(f"tau_table: --heads takes LABEL=DIR entries, got {item!r}")
        out[label.strip()] = Path(directory.strip())
    return out


def parse_drafter_args(items: Sequence[str]) -> dict[str, dict[str, object]]:
    """["dflash-b8:block_size=8", ...] -> {label: {key: value}} (values JSON where they parse, else strings)."""
    out: dict[str, dict[str, object]] = {}
    for item in items:
        label, sep, setting = item.partition(":")
        key, eq, raw = setting.partition("=")
        if not sep or not eq or not label.strip() or not key.strip():
            raise SystemExit(f"tau_table: --drafter-arg takes LABEL:KEY=VALUE, got {item!r}")
        try:
            value: object = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(label.strip(), {})[key.strip()] = value
    return out


def head_kind(directory: Path) -> str:
    """The drafter a trained head directory is for (its config.json)."""
    config = directory / "config.json"
    if not config.is_file():
        raise SystemExit(f"tau_table: {str(directory)!r} is not a head directory (no config.json)")
    return json.loads(config.read_text())["head"]["drafter"]


def configurations(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    budgets = [int(b) for b in args.budgets.split(",")]
    trees = set(args.trees.split(",")) if args.trees else None
    heads = parse_heads(args.heads)
    if heads:
        out = [(label, tree, b) for label, d in heads.items() for kind, tree in HEAD_CONFIGS + [("eagle3", "eagle2")]
               if kind == head_kind(d) for b in budgets]
        out = [c for c in out if trees is None or c[1] in trees]
        if not args.baselines:
            return out
        return out + [("ngram", "ddtree", b) for b in budgets] + [("self", "chain", int(b)) for b in args.self_budgets.split(",") if b]
    out = [(d, tree, b) for d, tree in HEAD_CONFIGS for b in budgets]
    out += [("ngram", "ddtree", b) for b in budgets]
    out += [("self", "chain", b) for b in [int(x) for x in args.self_budgets.split(",") if x]]
    out += [("eagle3", "eagle2", b) for b in budgets]
    return [c for c in out if trees is None or c[1] in trees]


def drafter_builders(target, args: argparse.Namespace) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """label -> a function that builds a fresh drafter of that row label (the heads of --heads, or the
    shipped / --heads-dir heads and the training-free baselines)."""
    import importlib

    from specbench.drafters import DRAFTERS

    for module in ("specbench.drafters.heads.parallel", "specbench.drafters.heads.jetspec_tree",
                   "specbench.drafters.eagle3.drafter"):  # registers them if the lazy entries are not there yet
        try:
            importlib.import_module(module)
        except ImportError as exc:
            print(f"tau_table: cannot import {module}: {exc}", file=sys.stderr)
    builders = {}
    heads = parse_heads(args.heads)
    extra = parse_drafter_args(args.drafter_arg)
    for label, directory in heads.items():
        builders[label] = lambda d=directory, kw=extra.get(label, {}): DRAFTERS.build(head_kind(d), target,
                                                                                   checkpoint=str(d), **kw)
    if not heads or args.baselines:
        for name in ("dflash", "jetspec", "jetspec-tree", "eagle3") if not heads else ():
            kwargs = {"checkpoint": str(Path(args.heads_dir) / name)} if args.heads_dir else {}
            builders[name] = lambda n=name, kw={**kwargs, **extra.get(name, {})}: DRAFTERS.build(n, target, **kw)
        builders["ngram"] = lambda kw=extra.get("ngram", {}): DRAFTERS.build("ngram", target, **kw)
        builders["self"] = lambda kw=extra.get("self", {}): DRAFTERS.build("self", target, layers=args.self_layers,
                                                                             **kw)
    unknown = sorted(set(extra) - set(builders))
    if unknown:
        raise SystemExit(f"tau_table: --drafter-arg names {', '.join(unknown)}, which is no row label here "
                         f"({', '.join(builders)}); a label of --heads or a shipped drafter")
    return builders


def load_drafters(target, args: argparse.Namespace) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """One drafter per row label; a shipped head that cannot load is skipped (the other rows are still
    worth having), a head of --heads that cannot load fails."""
    heads = parse_heads(args.heads)
    drafters = {}
    for label, build in drafter_builders(target, args).items():
        try:
            drafters[label] = build()  # type: ignore[operator]
        except Exception as exc:
            if label in heads:
                raise
            print(f"tau_table: skipping {label}: {exc}", file=sys.stderr)
    return drafters


def prompt_order(target, args: argparse.Namespace) -> list[tuple[str, str, list[int]]]:  # type: ignore[no-untyped-def]
    """(dataset, item id, prompt ids), round-robin over the datasets."""
    from specbench.data import load_dataset, turn_prompt_ids

    per = {}
    for name in args.datasets.split(","):
        items = load_dataset(name, args.data, n=args.n)
        per[name] = [(name, str(p.id), turn_prompt_ids(target, p, 0, [])) for p in items]
    out = []
    for i in range(max(len(v) for v in per.values())):
        out += [v[i] for v in per.values() if i < len(v)]
    return out


def print_table(rows: list[dict]) -> None:
    import pandas as pd

    if not rows:
        print("no rows yet")
        return
    df = pd.DataFrame(rows)
    df["config"] = df["drafter"] + "/" + df["tree"] + "/" + df["budget"].astype(str)
    table = df.pivot_table(index="config", columns="dataset", values="tau", aggfunc="mean")
    table["mean"] = table.mean(axis=1)
    counts = df.pivot_table(index="config", columns="dataset", values="tau", aggfunc="count")
    order = sorted(table.index, key=lambda c: (c.split("/")[0], c.split("/")[1], int(c.split("/")[2])))
    pd.set_option("display.width", 200)
    print(table.loc[order].round(3).to_string())
    print("\nprompts per cell:", counts.min().min(), "to", counts.max().max(),
          f"| teacher-forced near-tie positions: {int(df.drop_duplicates(['dataset', 'id'])['tf_mismatch'].sum())}"
          f" | rounds past the reference end: {int(df['ref_exhausted'].sum())}")


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (nan for one value): the paired comparisons' summary."""
    import math

    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1) / n) if n > 1 else float("nan")


def paired(rows: list[dict], spec: str) -> list[dict]:
    """'DRAFTER/TREE - DRAFTER/TREE' -> per budget and dataset (and over all datasets): the mean over the
    prompts both configurations have of tau(A) - tau(B), its standard error and n. Paired: each prompt is
    its own control, so a difference far smaller than the spread of tau over prompts still shows."""
    parts = [x.strip().split("/") for x in spec.split(" - ")]
    if len(parts) != 2 or any(len(x) != 2 or not all(x) for x in parts):
        raise SystemExit(f"--compare: {spec!r} is not 'DRAFTER/TREE - DRAFTER/TREE' "
                         "(e.g. 'dflash/ddtree - jetspec/ddtree')")
    (da, ta), (db, tb) = parts
    tau = {(r["drafter"], r["tree"], r["budget"], r["dataset"], r["id"]): r["tau"] for r in rows}
    out = []
    for budget in sorted({r["budget"] for r in rows}):
        diffs: dict[str, list[float]] = {}
        for (d, t, b, ds, i), value in tau.items():
            if (d, t, b) == (da, ta, budget) and (db, tb, budget, ds, i) in tau:
                diffs.setdefault(ds, []).append(value - tau[(db, tb, budget, ds, i)])
        if diffs:
            diffs["all"] = [x for v in diffs.values() for x in v]
        for ds in sorted(diffs, key=lambda k: (k == "all", k)):
            mean, se = mean_se(diffs[ds])
            out.append({"compare": spec, "budget": budget, "dataset": ds, "mean": mean, "se": se, "n": len(diffs[ds])})
    if not out:
        raise SystemExit(f"--compare: no prompt has both sides of {spec!r} at one budget in these rows")
    return out


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSONL file (gzip-compressed if it ends in .gz), [] if there is none; a last line cut by
    an interrupted run is dropped (it is redone)."""
    if not path.is_file():
        return []
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:  # only the last line can be cut by an interrupt; anything else is damage
                raise
    return rows


ROW_KEY = ("dataset", "id", "drafter", "tree", "budget")


def accepted_counts(accepted: Sequence[int]) -> list[int]:
    """Rounds by drafted tokens accepted: [rounds accepting 0, 1, ..., the most accepted] (how deep the trees'
    accepted paths reach: a block size or depth bound beyond the last entry never paid on this prompt)."""
    counts = [0] * (max(accepted, default=-1) + 1)
    for a in accepted:
        counts[a] += 1
    return counts


# GPU memory of one replay worker on CUDA: each configuration holds its own graphed decoder (a fresh drafter,
# caches, graph pools). Measured on an H100 on 2026-12-07: workers of 45 configurations (9 two-layer block heads)
# held 5.0-6.2 GiB when 14 of them ran out of its 79 GiB.
WORKER_BASE_GIB, WORKER_GIB_PER_CONFIG = 0.8, 0.13


def gpu_total_gib() -> float | None:
    """The first GPU's memory from nvidia-smi (the parent process stays off CUDA: its context would cost memory
    the workers need); None without one."""
    import subprocess

    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                              capture_output=True, text=True, timeout=30).stdout
        return float(text.split()[0]) / 1024
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def workers_that_fit(parallel: int, configs: int, total_gib: float | None) -> int:
    """At most `parallel` workers of `configs` configurations each in 90 % of a GPU of `total_gib`."""
    if total_gib is None or configs <= 0:
        return parallel
    per_worker = WORKER_BASE_GIB + WORKER_GIB_PER_CONFIG * configs
    return max(1, min(parallel, int(0.9 * total_gib / per_worker)))


def run_parallel(args: argparse.Namespace, out: Path, script: str = __file__, key: Sequence[str] = ROW_KEY,
                 show: Callable[[list[dict]], None] | None = None, configs: int | None = None) -> int:
    """N shard processes of `script` (this one, or another with the same --out/--shard/--parallel flags); their
    rows (and any earlier rows in OUT) are merged into OUT by `key`, without duplicates. On CUDA, with `configs`
    (configurations per worker) given, N is lowered to the workers that fit in the GPU's memory."""
    import subprocess

    n = args.parallel
    if configs is not None and str(getattr(args, "device", "")).startswith("cuda"):
        total = gpu_total_gib()
        n = workers_that_fit(args.parallel, configs, total)
        if n < args.parallel:
            print(f"{Path(script).stem}: --parallel {args.parallel} lowered to {n}: about "
                  f"{WORKER_BASE_GIB + WORKER_GIB_PER_CONFIG * configs:.1f} GiB a worker for {configs} configurations "
                  f"on a {total:.0f} GiB GPU", file=sys.stderr)
    argv = [a for a in sys.argv[1:]]
    drop = {"--parallel", "--out", "--shard"}
    base, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in drop:
            skip = True
            continue
        if a.split("=")[0] in drop:
            continue
        base.append(a)
    shards = [out.with_suffix(f".shard{k}.jsonl") for k in range(n)]
    seed_rows = read_rows(out)
    for path in shards:  # every shard resumes from what is already known
        known = {json.dumps(r, sort_keys=True) for r in read_rows(path)}
        with open(path, "a") as f:
            for r in seed_rows:
                if json.dumps(r, sort_keys=True) not in known:
                    f.write(json.dumps(r) + "\n")
    procs = [subprocess.Popen([sys.executable, script, *base, "--out", str(path), "--shard", f"{k}/{n}"])
             for k, path in enumerate(shards)]
    codes = [proc.wait() for proc in procs]
    (show or print_table)(merge_shards(out, key))
    return max(codes)


def merge_shards(out: Path, key: Sequence[str] = ROW_KEY) -> list[dict]:
    """OUT's rows and those of its shard files (OUT.shardK.jsonl, as `run_parallel` writes them, also after
    a cut run), merged into OUT by `key` without duplicates (written atomically); the shard files stay."""
    merged: dict[tuple, dict] = {}
    for path in [out, *sorted(out.parent.glob(out.stem + ".shard*.jsonl"))]:
        for r in read_rows(path):
            merged[tuple(r[k] for k in key)] = r
    tmp = out.with_suffix(".partial")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in merged.values()))
    tmp.replace(out)
    return list(merged.values())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="benchmark data directory (default $SPECBENCH_DATA)")
    p.add_argument("--out", required=True, help="JSONL of rows (appended; resumes)")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--target-name", default=None,
                   help="name the shipped heads are filed under (e.g. smollm2-135m when --target is gguf:PATH)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--minutes", type=float, default=None, help="stop cleanly (between prompts) after this long")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--n", type=int, default=100, help="items per dataset (MT-Bench has 80)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--budgets", default="16,64,256")
    p.add_argument("--self-budgets", default="4",
                   help="budgets for the self drafter: each round drafts a chain of B sequential shallow-model "
                        "steps, so large B costs B forwards per round (on a busy CPU that dominates the run)")
    p.add_argument("--self-layers", type=int, default=None, help="layers of the self drafter (default: half)")
    p.add_argument("--heads-dir", default=None, help="DIR with <drafter>/ head checkpoints instead of the shipped heads")
    p.add_argument("--drafters", default=None, help="only these drafters (comma-separated)")
    p.add_argument("--heads", default=None, help="LABEL=DIR,... trained head directories instead of the shipped heads")
    p.add_argument("--baselines", action="store_true", help="with --heads: add ngram and self")
    p.add_argument("--drafter-arg", action="append", default=[], metavar="LABEL:KEY=VALUE",
                   help="a drafter argument for one row label, repeatable; e.g. the shipped dflash head with shorter "
                        "blocks: --heads dflash-b8=specbench/heads/dflash-smollm2-135m --drafter-arg dflash-b8:block_size=8")
    p.add_argument("--trees", default=None, help="only these tree policies (comma-separated), e.g. ddtree,eagle2")
    p.add_argument("--ref-batch", type=int, default=1,
                   help="prompts whose greedy continuations are generated together (1 = exactly the engine's AR "
                        "numerics; larger is faster on a GPU)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is fastest on a shared CPU)")
    p.add_argument("--shard", default="0/1", help="K/N: only prompts K, K+N, K+2N, ... (of the round-robin order)")
    p.add_argument("--parallel", type=int, default=1,
                   help="run N shards as N processes (each writes OUT.shardK.jsonl; merged into OUT at the end); "
                        "on a GPU the per-round Python work is the bottleneck, so N processes share one GPU well")
    p.add_argument("--reverse", action="store_true",
                   help="take the remaining prompts from the end of the order (a second machine filling the same "
                        "table from the other end; merge the outputs, rows are keyed by prompt and configuration)")
    p.add_argument("--replay", choices=("auto", "device", "host"), default="auto",
                   help="exact replay as the device round (graphed on CUDA; a drafter per configuration) or as the "
                        "host walk (one drafter per head, its reference tables shared); auto: device on CUDA")
    p.add_argument("--table-only", action="store_true")
    p.add_argument("--compare", action="append", default=[], metavar="'DRAFTER/TREE - DRAFTER/TREE'",
                   help="with --table-only: also print the paired difference in tau per budget and dataset, "
                        "e.g. 'dflash/ddtree - jetspec/ddtree' (repeatable)")
    args = p.parse_args()
    if args.compare and not args.table_only:
        p.error("--compare prints from the rows in --out: add --table-only")
    out = Path(args.out)
    if args.parallel > 1:
        return run_parallel(args, out, configs=len(configurations(args)))
    rows = read_rows(out)
    if args.table_only:
        print_table(rows)
        for spec in args.compare:
            print()
            for d in paired(rows, spec):
                print(f"{d['compare']:<40} b{d['budget']:<4} {d['dataset']:<10} {d['mean']:+.3f} +- {d['se']:.3f}  "
                      f"(n {d['n']})")
        return 0

    from specbench.bench.replay import build_references, replay, replay_decoder
    from specbench.models import load_target
    from specbench.trees import TREE_POLICIES

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, device=args.device, dtype="float32")
    if args.target_name:
        target.name = args.target_name
    drafters = load_drafters(target, args)
    wanted = set(args.drafters.split(",")) if args.drafters else None
    configs = [c for c in configurations(args) if c[0] in drafters and (wanted is None or c[0] in wanted)]
    policies = {tree: TREE_POLICIES.build(tree) for _, tree, _ in configs}
    done = {(r["dataset"], r["id"], r["drafter"], r["tree"], r["budget"]) for r in rows}
    taps = sorted({t for d in drafters.values() for t in d.taps})  # type: ignore[attr-defined]
    if args.replay == "device" or (args.replay == "auto" and target.device.type == "cuda"):
        builders, used = drafter_builders(target, args), set()

        def own(label: str):  # type: ignore[no-untyped-def]
            """A drafter no other decoder uses (the device round's graphs hold its buffers): the loaded one
            for a label's first configuration, a fresh one for each further one."""
            if label in used:
                return builders[label]()  # type: ignore[operator]
            used.add(label)
            return drafters[label]

        decoders = {c: replay_decoder(own(c[0]), policies[c[1]], c[2], replay_on_device=True) for c in configs}
    else:  # the host walk: one drafter serves its trees and budgets (its precomputation along a reference too)
        decoders = {c: replay_decoder(drafters[c[0]], policies[c[1]], c[2], replay_on_device=False)  # type: ignore[arg-type]
                    for c in configs}
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    shard, shards = (int(x) for x in args.shard.split("/"))
    todo = [(ds, pid, ids) for i, (ds, pid, ids) in enumerate(prompt_order(target, args))
            if i % shards == shard and any((ds, pid, d, t, b) not in done for d, t, b in configs)]
    if args.reverse:
        todo.reverse()
    print(f"tau_table: {len(todo)} prompts to go, {len(configs)} configurations each", file=sys.stderr)
    with open(out, "a") as f:
        for g in range(0, len(todo), args.ref_batch):
            if args.minutes is not None and time.monotonic() - start > 60 * args.minutes:
                print(f"tau_table: stopping at the {args.minutes} min budget ({g}/{len(todo)} prompts done)",
                      file=sys.stderr)
                break
            group = todo[g: g + args.ref_batch]
            t0 = time.monotonic()
            refs = build_references(target, [ids for _, _, ids in group], args.max_new_tokens, taps,
                                    batch_size=args.ref_batch)
            t_ref = (time.monotonic() - t0) / len(group)
            for k, ((ds, pid, ids), ref) in enumerate(zip(group, refs), start=g):
                if args.minutes is not None and time.monotonic() - start > 60 * args.minutes:
                    break  # rows are written per prompt: a rerun picks up the rest of this group
                t0 = time.monotonic()
                for d, tree, budget in configs:
                    if (ds, pid, d, tree, budget) in done:
                        continue
                    decoder = decoders[(d, tree, budget)]
                    drafter = decoder.drafter
                    t1 = time.monotonic()
                    res = replay(drafter, ref, policies[tree], budget, args.max_new_tokens, decoder=decoder)  # type: ignore[arg-type]
                    row = {"dataset": ds, "id": pid, "drafter": d, "kind": getattr(drafter, "name", d), "tree": tree,
                           "budget": budget, "tau": res.tau,
                           "rounds": len(res.accepted), "new_tokens": len(res.output), "prompt_len": len(ids),
                           "accepted_counts": accepted_counts(res.accepted),
                           "tf_mismatch": ref.tf_mismatch, "ref_exhausted": res.ref_exhausted,
                           "time_s": round(time.monotonic() - t1, 3), "ref_time_s": round(t_ref, 3),
                           "max_new_tokens": args.max_new_tokens}
                    f.write(json.dumps(row) + "\n")
                    rows.append(row)
                f.flush()
                print(f"tau_table: {k + 1}/{len(todo)} {ds}/{pid} in {time.monotonic() - t0 + t_ref:.1f}s "
                      f"(total {time.monotonic() - start:.0f}s)", file=sys.stderr, flush=True)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
