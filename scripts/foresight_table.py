"""JetSpec++ Table 3 / Table 16 on the GPU: AR, dflash, jetspec, jetspec++ on the critical path and
jetspec++ pipelined (foresight beside the verify forward), same target, same run, greedy.

    python scripts/foresight_table.py --data ../shared/data --device cuda --dtype bfloat16 \\
        --head RUN/heads/jetspec++ [--calibration runs/foresight_hits/NAME/calibration.json] \\
        --n 5 --max-new-tokens 256 --out results/foresight_table.jsonl

Per prompt and configuration one JSONL row (appended; rerun to resume): decode tok/s, speed-up over
AR on the same prompt, tau, hit rate (rounds whose tree came from the speculation cache, among rounds
with a foresight pass before them), tau on hit and on miss rounds, and per round: round time (decode
wall time / rounds), verify time (the verify forward's CUDA-event time) and exposed time = round -
verify, plus every stage's mean (stage_NAME_ms). "jetspec++ pipelined" is foresight in the device round
(the foresight stage replayed from a CUDA graph on a second stream beside the verify forward;
stage_foresight_ms is the main stream's wait for it, the exposed part, and side_foresight_ms its own
span on the side stream); "jetspec++ pipelined host" is the host round's foresight (drafter_args
host=true; stage_foresight_ms is then the host time launching the pass). Each configuration is warmed
up once (CUDA graphs are captured there). `--draft-device cuda:1` puts jetspec++'s draft model on a second GPU (issue 17; `--draft-copy`: that path with
both on one device); `--head` may
be a plain jetspec head with `--states stale|true` when no jetspec++ head exists. "jetspec++ critical"
is the device round (CUDA-graphed, docs/jetspecpp.md); `--configs ...,jetspec++ host` adds the
host-driven round (drafter_args host=true) beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def configs(args: argparse.Namespace) -> dict[str, dict]:
    policy, budget = args.tree.split(":")[0], int(args.tree.split(":")[1])
    jpp = {"checkpoint": args.head, "J": args.J, "R": args.R, "states": args.states}
    if args.draft_device:
        jpp["draft_device"] = args.draft_device
    if args.draft_copy:
        jpp["draft_copy"] = True
    piped = dict(jpp, foresight="on", B=args.B)
    if args.calibration:
        piped["calibration"] = args.calibration
    out = {"ar": {"drafter": None},
           "dflash": {"drafter": "dflash", "tree": policy, "budget": budget},
           "jetspec": {"drafter": "jetspec", "tree": policy, "budget": budget},
           "jetspec++ host": {"drafter": "jetspec++", "tree": policy, "budget": budget, "args": dict(jpp, host=True)},
           "jetspec++ critical": {"drafter": "jetspec++", "tree": policy, "budget": budget, "args": jpp},
           "jetspec++ pipelined": {"drafter": "jetspec++", "tree": policy, "budget": budget, "args": piped},
           "jetspec++ pipelined host": {"drafter": "jetspec++", "tree": policy, "budget": budget,
                                        "args": dict(piped, host=True)}}
    return {k: v for k, v in out.items() if k in args.configs.split(",")}


def measure(decoder, ids: list[int], new: int) -> dict:  # type: ignore[no-untyped-def]
    """One timed generation: the row's numbers (hit flags from a foreseeing drafter's round log)."""
    drafter = decoder.drafter
    fs = getattr(drafter, "foresight", None)
    if fs is not None:
        fs.clear_log()
    res = decoder.generate(ids, new)
    st = res.stats
    rounds = st.rounds
    n = len(rounds)
    stages: dict[str, float] = {}
    for r in rounds:
        for k, v in r.times.items():
            stages[k] = stages.get(k, 0.0) + v
    sides = [r.side_time for r in rounds if r.side_time is not None]  # the foresight stage's own span, side stream
    round_ms = 1e3 * st.decode_time / n if n else 0.0
    verify_ms = 1e3 * stages.get("verify_forward", 0.0) / n if n else 0.0  # the target's verify pass
    row = {"tok_s": st.decode_tokens_per_s, "tau": st.tau, "rounds": n, "new_tokens": st.new_tokens,
           "round_ms": round_ms, "verify_ms": verify_ms, "exposed_ms": round_ms - verify_ms,
           "exposed_frac": (round_ms - verify_ms) / round_ms if round_ms else 0.0,
           **{f"stage_{k}_ms": 1e3 * v / n for k, v in stages.items()},
           "side_foresight_ms": 1e3 * sum(sides) / len(sides) if sides else None, "output": res.tokens}
    if fs is not None and fs.mode == "on":
        flags = [e["hit"] for e in fs.log]
        assert len(flags) == n, f"{len(flags)} drafted rounds logged for {n} rounds"
        hit_tau = [r.accepted + 1 for r, f in zip(rounds, flags) if f]
        miss_tau = [r.accepted + 1 for r, f in zip(rounds, flags) if f is False]
        row.update(hit_rate=len(hit_tau) / max(1, len(hit_tau) + len(miss_tau)),
                   tau_hit=sum(hit_tau) / len(hit_tau) if hit_tau else None,
                   tau_miss=sum(miss_tau) / len(miss_tau) if miss_tau else None)
    return row


def keep_median(runs: list[dict]) -> dict:
    """Of repeated measurements of one prompt, the median-time one (the lower middle), with every
    repeat's tok/s and whether they emitted the same tokens."""
    from specbench.bench.runner import median_by

    kept = dict(median_by(runs, key=lambda r: r["round_ms"]))
    kept.update(repeats=len(runs), tok_s_repeats=[r["tok_s"] for r in runs],
                repeats_agree=all(r["output"] == runs[0]["output"] for r in runs))
    return kept


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSONL of rows (appended; resumes)")
    p.add_argument("--data", default=None)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--attention", default="auto")
    p.add_argument("--head", default=None, help="jetspec++ checkpoint (or a plain jetspec head with --states stale|true)")
    p.add_argument("--states", default="predicted", choices=("predicted", "stale", "true"))
    p.add_argument("--J", type=int, default=1)
    p.add_argument("--R", type=int, default=1)
    p.add_argument("--B", type=int, default=16)
    p.add_argument("--calibration", default=None, help="calibration.json from scripts/foresight_hits.py")
    p.add_argument("--draft-device", default=None, help="jetspec++'s draft model on another device (e.g. cuda:1)")
    p.add_argument("--draft-copy", action="store_true",
                   help="the two-device path (the draft model's own weights, transfers) even on the target's device")
    p.add_argument("--tree", default="chain:16", help="POLICY:BUDGET for every drafter")
    p.add_argument("--configs", default="ar,dflash,jetspec,jetspec++ critical,jetspec++ pipelined",
                   help="comma-separated, of: ar, dflash, jetspec, jetspec++ host, jetspec++ critical, jetspec++ pipelined, "
                        "jetspec++ pipelined host")
    p.add_argument("--datasets", default="gsm8k,math500")
    p.add_argument("--n", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--warmup-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3,
                   help="decode each prompt this many times and keep the median-time run (one host stall moves no row)")
    p.add_argument("--table-only", action="store_true")
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    out = Path(args.out)
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.is_file() else []
    if not args.table_only:
        run(args, out, rows)
    print_table(rows)
    return 0


def run(args: argparse.Namespace, out: Path, rows: list[dict]) -> None:
    from specbench.config import SpecConfig
    from specbench.data import load_dataset, turn_prompt_ids
    from specbench.engine import SpecDecoder
    from specbench.models import load_target

    torch.set_grad_enabled(False)
    target = load_target(args.target, device=args.device, dtype=args.dtype, attention=args.attention)
    items = [(ds, str(it.id), turn_prompt_ids(target, it, 0, [])) for ds in args.datasets.split(",")
             for it in load_dataset(ds, args.data, n=args.n)]
    done = {(r["config"], r["dataset"], r["id"]) for r in rows}
    ar_tok_s = {(r["dataset"], r["id"]): r["tok_s"] for r in rows if r["config"] == "ar"}
    out.parent.mkdir(parents=True, exist_ok=True)
    for name, cfg in configs(args).items():
        todo = [x for x in items if (name, x[0], x[1]) not in done]
        if not todo:
            continue
        spec = SpecConfig(drafter=cfg["drafter"], tree=cfg.get("tree", "chain"), budget=cfg.get("budget", 1),
                          drafter_args=cfg.get("args", {}))
        decoder = SpecDecoder(target, spec, max_seq_len=2048)
        decoder.generate(todo[0][2], args.warmup_tokens)  # graph capture, Triton JIT, allocator
        for _, _, ids in todo[1:4]:  # a branching round (foresight in the device round): capture the hit branch too
            if not decoder.branching or "hit" in decoder.captured or not decoder.cuda_graphs:
                break
            decoder.generate(ids, args.warmup_tokens)
        for ds, pid, ids in todo:
            t0 = time.monotonic()
            kept = keep_median([measure(decoder, ids, args.max_new_tokens) for _ in range(args.repeats)])
            row = {"config": name, "dataset": ds, "id": pid, **kept,
                   "tree": args.tree, "device": args.device, "dtype": args.dtype, "head": args.head, "states": args.states,
                   "draft_device": args.draft_device, "draft_copy": args.draft_copy, "B": args.B,
                   "calibration": args.calibration}
            if name == "ar":
                ar_tok_s[(ds, pid)] = row["tok_s"]
            base = ar_tok_s.get((ds, pid))
            row["speedup"] = row["tok_s"] / base if base else None
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
            print(f"foresight_table: {name} {ds}/{pid} tau {row['tau']:.2f} {row['tok_s']:.1f} tok/s "
                  f"({time.monotonic() - t0:.1f}s)", file=sys.stderr, flush=True)
        del decoder
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def print_table(rows: list[dict]) -> None:
    import pandas as pd

    if not rows:
        print("no rows yet")
        return
    df = pd.DataFrame(rows)
    cols = [c for c in ("tok_s", "speedup", "tau", "hit_rate", "tau_hit", "tau_miss", "round_ms", "verify_ms",
                        "exposed_ms", "exposed_frac", "stage_draft_ms", "stage_tree_ms", "stage_foresight_ms",
                        "side_foresight_ms") if c in df]
    pd.set_option("display.width", 240)
    table = df.groupby(["dataset", "config"], sort=False)[cols].mean(numeric_only=True)
    print(table.round(3).to_string())
    print("\nprompts per cell:", df.groupby(["dataset", "config"]).size().min(), "to",
          df.groupby(["dataset", "config"]).size().max())


if __name__ == "__main__":
    sys.exit(main())
