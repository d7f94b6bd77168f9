"""Which head configuration to ship: tau per unit of drafting cost for the heads of an ablation run
(`specbench train --grid num_layers=2,3 --grid num_taps=1,5 --grid block_size=8 ...`).

    python scripts/ablation_table.py --run RUN --data ../shared/data --out RUN/ablation [--n 30] [--device cuda --dtype bfloat16]
    python scripts/ablation_table.py --run RUN --out RUN/ablation --table-only

1. cost in the real decode loop on this device: per (head, budget), `--cost-prompts` GSM8K prompts decoded
   greedily for --cost-tokens tokens after a warm-up; mean time per round (decode time / rounds) and its
   draft stage; AR decoding of the same prompts gives the time per AR step: OUT/cost.json. It comes first
   because only the device it is for can measure it; a cut-off tau replay can be finished anywhere.
2. tau by exact replay (scripts/tau_table.py --heads, T = 0, fp32) of every head in RUN/heads on --datasets,
   parallel heads under ddtree, eagle3 under eagle2, in what is left of --minutes: OUT/tau.jsonl (resumable;
   `--device cpu --no-cost` on another machine finishes it and keeps OUT/cost.json).
3. the table: tau (mean over prompts and datasets), draft and round ms, and the projected speed-up
   tau * t_AR / t_round = tau per unit of round cost, which is what a researcher sees; heads sorted by it
   per budget. Cost does not depend on the weights, only on the head's shape and the budget, so measure
   it on the machine the heads are for (the H200: a CPU ranks drafting costs differently).
Options after the known ones go to tau_table.py (e.g. --parallel 8 --minutes 8 --ref-batch 4).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
from tau_table import head_kind, read_rows  # noqa: E402

TREES = {"eagle3": "eagle2"}  # other heads: ddtree


def head_dirs(run: Path) -> dict[str, Path]:
    heads = {p.name: p for p in sorted((run / "heads").iterdir()) if (p / "config.json").is_file()} \
        if (run / "heads").is_dir() else {}
    if not heads:
        raise SystemExit(f"ablation_table: {str(run / 'heads')!r} holds no head directories")
    return heads


def shape(directory: Path) -> dict:
    head = json.loads((directory / "config.json").read_text())["head"]
    import torch
    from safetensors.torch import load_file

    weights = load_file(str(directory / "head.safetensors"))  # int8 matrices + fp32 scales, or floats
    params = sum(t.numel() for k, t in weights.items()
                 if not k.endswith(".int8_scale") and (t.is_floating_point() or t.dtype == torch.int8))
    return {"kind": head.get("drafter"), "layers": head.get("num_layers", 1), "block": head.get("block_size"),
            "taps": len(head.get("taps") or head.get("feature_layers") or []), "params_m": params / 1e6}


def measure_cost(args: argparse.Namespace, heads: dict[str, Path], budgets: list[int], path: Path) -> dict:
    """{label: {budget: {round_ms, draft_ms, ...}}, "ar_ms": ..., "device": ...} (resumes from `path`)."""
    import torch

    from specbench.config import SpecConfig
    from specbench.data import load_dataset, turn_prompt_ids
    from specbench.engine import SpecDecoder, ar_decoder
    from specbench.models import load_target

    where = {"device": args.device, "dtype": args.dtype}
    cost = json.loads(path.read_text()) if path.is_file() else {}
    if cost.get("where") != where:
        cost = {"where": where, "heads": {}}
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    prompts = [turn_prompt_ids(target, p, 0, []) for p in load_dataset("gsm8k", args.data, n=args.cost_prompts)]

    def timed(decoder: SpecDecoder) -> tuple[float, float, float]:
        decoder.generate(prompts[0], args.cost_tokens)  # warm-up at the timed length (graph capture, JIT, the
        # allocator): a 16-token warm-up left the first head's budget-64 rounds 2.5x slow on the H200
        rounds, decode, draft = 0, 0.0, 0.0
        for p in prompts:
            st = decoder.generate(p, args.cost_tokens).stats
            rounds += len(st.rounds)
            decode += st.decode_time
            draft += st.stage_times().get("draft", 0.0)
        return rounds, decode, draft

    if "ar_ms" not in cost:
        rounds, decode, _ = timed(ar_decoder(target))
        cost["ar_ms"] = 1e3 * decode / max(rounds, 1)
    for label, d in heads.items():
        kind = head_kind(d)
        for b in budgets:
            if str(b) in cost["heads"].get(label, {}):
                continue
            dec = SpecDecoder(target, SpecConfig(drafter=kind, tree=TREES.get(kind, "ddtree"), budget=b,
                                                 drafter_args={"checkpoint": str(d)}))
            t0 = time.monotonic()
            rounds, decode, draft = timed(dec)
            cost["heads"].setdefault(label, {})[str(b)] = {"round_ms": 1e3 * decode / max(rounds, 1),
                                                          "draft_ms": 1e3 * draft / max(rounds, 1), "rounds": rounds}
            path.write_text(json.dumps(cost, indent=2))
            print(f"ablation_table: cost {label}/{b}: {cost['heads'][label][str(b)]['round_ms']:.1f} ms/round "
                  f"({time.monotonic() - t0:.0f}s)", file=sys.stderr)
            del dec
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    path.write_text(json.dumps(cost, indent=2))
    return cost


def table(rows: list[dict], cost: dict, heads: dict[str, Path]) -> str:
    import pandas as pd

    if not rows:
        return "no tau rows yet"
    df = pd.DataFrame(rows)
    per_ds = df.groupby(["drafter", "budget", "dataset"])["tau"].mean().unstack("dataset")
    out = []
    for (label, budget), taus in per_ds.iterrows():
        item = {"head": label, **shape(heads[label]), "budget": int(budget), **{f"tau_{k}": v for k, v in taus.items()},
                "tau": float(taus.mean())}
        c = cost.get("heads", {}).get(label, {}).get(str(int(budget)))
        if c and cost.get("ar_ms"):
            item.update(draft_ms=c["draft_ms"], round_ms=c["round_ms"], ar_ms=cost["ar_ms"],
                        proj_speedup=item["tau"] * cost["ar_ms"] / c["round_ms"])
        out.append(item)
    t = pd.DataFrame(out).sort_values(["budget", "proj_speedup" if "proj_speedup" in out[0] else "tau"],
                                      ascending=[True, False])
    pd.set_option("display.width", 220)
    where = cost.get("where", {})
    return (f"cost measured on {where.get('device')} ({where.get('dtype')}); proj_speedup = tau * ar_ms / round_ms\n"
            + t.round(3).to_string(index=False))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True)
    p.add_argument("--out", required=True, help="directory for tau.jsonl and cost.json")
    p.add_argument("--data", default=None)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--datasets", default="gsm8k,math500,mbpp,humaneval,mt_bench")
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--budgets", default="16,64,256")
    p.add_argument("--device", default="cpu", help="where the cost is measured (tau replays use the same)")
    p.add_argument("--dtype", default=None, help="dtype of the cost runs (default bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--cost-prompts", type=int, default=2)
    p.add_argument("--cost-tokens", type=int, default=128)
    p.add_argument("--no-cost", action="store_true")
    p.add_argument("--minutes", type=float, default=None, help="time for cost and tau together (tau stops between prompts)")
    p.add_argument("--table-only", action="store_true")
    args, passthrough = p.parse_known_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    run, out = Path(args.run), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    heads = head_dirs(run)
    budgets = [int(b) for b in args.budgets.split(",")]
    code, start = 0, time.monotonic()
    if not args.table_only:
        if not args.no_cost:
            measure_cost(args, heads, budgets, out / "cost.json")
        minutes = [] if args.minutes is None else \
            ["--minutes", f"{max(0.5, args.minutes - (time.monotonic() - start) / 60):.2f}"]
        cmd = [sys.executable, str(SCRIPTS / "tau_table.py"), "--out", str(out / "tau.jsonl"), "--target", args.target,
               "--heads", ",".join(f"{k}={v}" for k, v in heads.items()), "--datasets", args.datasets, "--n", str(args.n),
               "--budgets", args.budgets, "--trees", "ddtree,eagle2", "--device", args.device,
               *(["--data", args.data] if args.data else []), *minutes, *passthrough]
        code = subprocess.run(cmd).returncode
    cost_path = out / "cost.json"
    cost = json.loads(cost_path.read_text()) if cost_path.is_file() else {}
    print(table(read_rows(out / "tau.jsonl"), cost, heads))
    return code


if __name__ == "__main__":
    sys.exit(main())
