"""Offline hit rate of foresight's selection rules (JetSpec++ Tables 10 and 11) from recorded rounds.

    python scripts/foresight_hits.py --data ../shared/data --head specbench/heads/jetspec-smollm2-135m \\
        --states true --tree chain:16 --datasets gsm8k,math500 --n 10 --out runs/foresight_hits/jetspec-true

Step 1 records rounds: every prompt is decoded by the `jetspec++` drafter (J, R, states as given) in
foresight mode `score` (each round: the decoder's P̂ of the block under verification, the draft's own
rows, the verified outcome; nothing drafted ahead, so the rounds are the critical path's), by exact
replay at T = 0 (`--mode replay`, the greedy reference and its teacher-forced states) or by real
decoding (`--mode decode`); `--foresight on` records the pipelined rounds instead (blocks served from
the cache on hits). One file per prompt under OUT/records: rerun the same command to resume.
Step 2 evaluates every rule at B = 1, 4, 8, 16 with the calibration cross-fitted over prompt folds,
prints the tables (hit rates, and each miss split into wrong k / right k but wrong anchor), writes
OUT/hits.json, OUT/calibration.json and (records with context stats) OUT/calibration_ngram.json, each
fitted on all rounds: pass one to the drafter as calibration=PATH. `--eval-only` skips step 1, so
rules are re-scored on the same recorded rounds without running a model.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

DATASETS = ("gsm8k", "math500")


def prompts(target, data: str | None, datasets: list[str], n: int) -> list[tuple[str, str, list[int]]]:  # type: ignore[no-untyped-def]
    from specbench.data import load_dataset, turn_prompt_ids

    per = {name: [(name, str(p.id), turn_prompt_ids(target, p, 0, [])) for p in load_dataset(name, data, n=n)]
           for name in datasets}
    out = []
    for i in range(max(len(v) for v in per.values())):  # round-robin: a partial run covers every dataset
        out += [v[i] for v in per.values() if i < len(v)]
    return out


def stem(dataset: str, item_id: str) -> str:
    """A file name for one prompt's records (item ids may hold '/', e.g. MATH-500's)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{dataset}-{item_id}")


def record(args: argparse.Namespace, out: Path) -> None:
    from specbench.bench.replay import build_references, replay
    from specbench.config import SpecConfig
    from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
    from specbench.engine import SpecDecoder
    from specbench.models import load_target
    from specbench.trees import TREE_POLICIES

    target = load_target(args.target, device=args.device, dtype=args.dtype)
    policy_name, budget = args.tree.split(":")[0], int(args.tree.split(":")[1])
    drafter = JetSpecPPDrafter(target, checkpoint=args.head, J=args.J, R=args.R, replace=not args.no_replace,
                               states=args.states, foresight=args.foresight, B=args.B, record=True,
                               calibration=args.calibration)
    policy = TREE_POLICIES.build(policy_name)
    decoder = SpecDecoder(target, SpecConfig(drafter="jetspec++", tree=policy_name, budget=budget), drafter=drafter,
                          max_seq_len=args.max_seq_len) if args.mode == "decode" else None
    folder = out / "records"
    folder.mkdir(parents=True, exist_ok=True)
    todo = [p for p in prompts(target, args.data, args.datasets.split(","), args.n)
            if not (folder / f"{stem(p[0], p[1])}.pt").is_file()]
    print(f"foresight_hits: {len(todo)} prompts to record in {folder}", file=sys.stderr)
    start = time.monotonic()
    for k, (ds, pid, ids) in enumerate(todo):
        if args.minutes is not None and time.monotonic() - start > 60 * args.minutes:
            print(f"foresight_hits: stopping at the {args.minutes} min budget (rerun to resume)", file=sys.stderr)
            break
        t0 = time.monotonic()
        drafter.foresight.clear_log()
        if decoder is not None:
            tau = decoder.generate(ids, args.max_new_tokens).stats.tau
        else:
            ref = build_references(target, [ids], args.max_new_tokens, drafter.taps)[0]
            tau = replay(drafter, ref, policy, budget, args.max_new_tokens).tau
        recs = [r.to_dict() for r in drafter.foresight.records]
        meta = {"dataset": ds, "id": pid, "tau": tau, "rounds": len(recs), "time_s": round(time.monotonic() - t0, 1)}
        tmp = folder / f".{stem(ds, pid)}.pt.tmp"
        torch.save({"meta": meta, "records": recs}, tmp)
        os.replace(tmp, folder / f"{stem(ds, pid)}.pt")
        print(f"foresight_hits: {k + 1}/{len(todo)} {ds}/{pid} tau {tau:.2f} rounds {len(recs)} "
              f"({meta['time_s']}s)", file=sys.stderr, flush=True)


def evaluate(args: argparse.Namespace, out: Path) -> None:
    import pandas as pd

    from specbench.bench.hit_rate import evaluate as evaluate_rules, fit_calibration
    from specbench.drafters.jetspecpp.speculation import RoundRecord

    files = sorted((out / "records").glob("*.pt"))
    if not files:
        raise SystemExit(f"no records under {out / 'records'}: run without --eval-only first")
    loaded = [torch.load(f, weights_only=False) for f in files]
    data = [(x["meta"]["dataset"], [RoundRecord.from_dict(r) for r in x["records"]]) for x in loaded]
    Bs = tuple(int(b) for b in args.Bs.split(","))
    rows, reliability, _ = evaluate_rules(data, Bs=Bs, lam=args.lam, ratio=args.ratio, folds=args.folds)
    everything = [r for _, rounds in data for r in rounds]
    cal = fit_calibration(everything)
    cal.save(out / "calibration.json")
    cal_ng = None
    if all(r.context is not None for r in everything):
        cal_ng = fit_calibration(everything, ngram=True)
        cal_ng.save(out / "calibration_ngram.json")
    served = [r.hit for _, rounds in data for r in rounds if r.hit is not None]
    taus = pd.DataFrame([x["meta"] for x in loaded]).groupby("dataset")["tau"].mean().round(3).to_dict()
    summary = {"hit_rates": rows, "reliability": reliability, "calibration": list(cal.betas),
               "calibration_ngram": {"betas": list(cal_ng.betas), "etas": list(cal_ng.etas)} if cal_ng else None, "tau": taus,
               "prompts": pd.DataFrame([x["meta"] for x in loaded]).groupby("dataset").size().to_dict(),
               "live_hit_rate": sum(served) / len(served) if served else None, "args": vars(args)}
    (out / "hits.json").write_text(json.dumps(summary, indent=1) + "\n")
    df = pd.DataFrame(rows)
    table = df.pivot_table(index="rule", columns=["dataset", "B"], values="hit_rate").reindex(
        [r for r in ("calibrated", "calibrated-ngram", "uncalibrated", "threshold", "draft", "ssd", "ssd-decoder")
         if r in set(df["rule"])])
    pd.set_option("display.width", 220)
    print(f"hit rate (rounds per dataset: {df.groupby('dataset')['rounds'].max().to_dict()}; tau {taus})")
    print(table.round(3).to_string())
    misses = df[df["rule"].isin(["calibrated", "calibrated-ngram"])].melt(
        id_vars=["dataset", "rule", "B"], value_vars=["miss_wrong_k", "miss_wrong_anchor"], var_name="miss")
    print("\nmisses (fraction of rounds): wrong k = no selected outcome stops at the verified node")
    print(misses.pivot_table(index=["rule", "miss"], columns=["dataset", "B"], values="value").round(3).to_string())
    sel = df[df["rule"] == "threshold"].pivot_table(index="rule", columns=["dataset", "B"], values="mean_selected")
    print(f"\nthreshold λ = {args.lam}: mean outcomes selected\n{sel.round(2).to_string()}")
    print("\nreliability (held-out folds): outcome NLL (nats/round), ECE of the top-16 scores")
    print(pd.DataFrame(reliability).round(3).to_string(index=False))
    print(f"\ncalibration fitted on all rounds (per-depth beta): {[round(b, 3) for b in cal.betas]}")
    if cal_ng is not None:
        print(f"n-gram calibration fitted on all rounds: beta {[round(b, 3) for b in cal_ng.betas]}, "
              f"eta (levels: in the context, keys of 1..3 tokens) {[round(e, 3) for e in cal_ng.etas]}")
    if served:
        print(f"live cache hit rate of the recorded run: {summary['live_hit_rate']:.3f} over {len(served)} rounds")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory (records/, hits.json, calibration.json); resumes")
    p.add_argument("--data", default=None, help="benchmark data directory (default $SPECBENCH_DATA)")
    p.add_argument("--head", default=None, help="jetspec++ checkpoint, or a plain jetspec head (states=stale|true)")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--states", default="predicted", choices=("predicted", "stale", "true"))
    p.add_argument("--J", type=int, default=1)
    p.add_argument("--R", type=int, default=1)
    p.add_argument("--no-replace", action="store_true", help="refresh without anchor replacement")
    p.add_argument("--tree", default="chain:16", help="POLICY:BUDGET of the verified blocks")
    p.add_argument("--mode", default="replay", choices=("replay", "decode"))
    p.add_argument("--foresight", default="score", choices=("score", "on"),
                   help="score: critical-path rounds; on: pipelined rounds (blocks served from the cache)")
    p.add_argument("--B", type=int, default=16, help="the drafter's own B (foresight=on)")
    p.add_argument("--calibration", default=None, help="the drafter's own calibration (foresight=on)")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--n", type=int, default=10, help="items per dataset")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--Bs", default="1,4,8,16")
    p.add_argument("--lam", type=float, default=0.01, help="the threshold rule's λ")
    p.add_argument("--ratio", type=float, default=0.5, help="the SSD fan-out's geometric ratio")
    p.add_argument("--folds", type=int, default=2, help="cross-fitting folds of the calibration (by prompt)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is fastest on a shared CPU)")
    p.add_argument("--minutes", type=float, default=None, help="stop recording cleanly (between prompts) after this long")
    p.add_argument("--eval-only", action="store_true")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    if not args.eval_only:
        record(args, out)
    evaluate(args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
