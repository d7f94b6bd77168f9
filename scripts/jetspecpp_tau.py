"""tau at T = 0 of jetspec++ settings (J refinement passes, R context refreshes, anchor replacement,
state source) for one or more heads, by exact replay (specbench.bench.replay, the drafter's own
begin/draft/observe on the greedy reference).

    python scripts/jetspecpp_tau.py --data ../shared/data --head jetspec++=runs/jpp/heads/jetspec++ \\
        --head jetspec=specbench/heads/jetspec-smollm2-135m --settings J0R0,J1R0,J2R0,J3R0,J1R1,J1R1n \\
        --trees chain:16,ddtree:64 --n 10 --out results/jpp_tau.jsonl

Settings: JjRr (anchor replacement on), JjRrn (off), optionally :stale or :true (the state source
the refresh's decoder reads; default the adapter's predictions). A head without an adapter (a plain
jetspec head) runs only R = 0 and the stale/true settings. One JSONL row per (prompt, head, setting,
tree, budget), appended and flushed as each is replayed (--minutes stops between configurations): rerun the
same command to resume. `--parallel N` runs N
shard processes (on a GPU: `--device cuda --parallel 14`) and merges their rows into OUT.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tau_table import mean_se, read_rows, run_parallel  # noqa: E402

ROW_KEY = ("dataset", "id", "head", "setting", "tree", "budget")
DATASETS = ("gsm8k", "math500", "mbpp", "humaneval", "mt_bench")
SETTING = re.compile(r"^J(\d+)R(\d+)(n?)(?::(predicted|stale|true))?$")


def parse_setting(text: str) -> dict:
    m = SETTING.match(text)
    if not m:
        raise SystemExit(f"--settings: {text!r} is not of the form JjRr[n][:predicted|stale|true] (e.g. J1R1, J2R1n:true)")
    return {"J": int(m.group(1)), "R": int(m.group(2)), "replace": not m.group(3), "states": m.group(4) or "predicted"}


def prompts(target, args: argparse.Namespace) -> list[tuple[str, str, list[int]]]:  # type: ignore[no-untyped-def]
    from specbench.data import load_dataset, turn_prompt_ids

    per = {name: [(name, str(p.id), turn_prompt_ids(target, p, 0, [])) for p in load_dataset(name, args.data, n=args.n)]
           for name in args.datasets.split(",")}
    out = []
    for i in range(max(len(v) for v in per.values())):  # round-robin: a partial run covers every dataset
        out += [v[i] for v in per.values() if i < len(v)]
    return out


def print_table(rows: list[dict]) -> None:
    import pandas as pd

    if not rows:
        print("no rows yet")
        return
    df = pd.DataFrame(rows)
    df["config"] = df["head"] + " " + df["setting"] + " " + df["tree"] + "/" + df["budget"].astype(str)
    table = df.pivot_table(index="config", columns="dataset", values="tau", aggfunc="mean")
    table["mean"] = table.mean(axis=1)
    counts = df.pivot_table(index="config", columns="dataset", values="tau", aggfunc="count")
    pd.set_option("display.width", 200)
    print(table.round(3).to_string())
    print("\nprompts per cell:", int(counts.min().min()), "to", int(counts.max().max()))


def paired(rows: list[dict], spec: str) -> list[dict]:
    """'HEAD SETTING - HEAD SETTING' -> per tree/budget: the mean over the prompts both configurations
    have of tau(A) - tau(B), its standard error and n (paired: each prompt is its own control)."""
    parts = [x.split() for x in spec.split(" - ")]
    if len(parts) != 2 or any(len(x) != 2 for x in parts):
        raise SystemExit(f"--compare: {spec!r} is not 'HEAD SETTING - HEAD SETTING' (e.g. 'jetspec J1R0 - jetspec J0R0')")
    (ha, sa), (hb, sb) = parts
    tau: dict[tuple, float] = {(r["head"], r["setting"], r["tree"], r["budget"], r["dataset"], r["id"]): r["tau"] for r in rows}
    out = []
    for tree, budget in sorted({(r["tree"], r["budget"]) for r in rows}):
        diffs = [tau[(ha, sa, tree, budget, ds, i)] - tau[(hb, sb, tree, budget, ds, i)]
                 for (h, st, t, b, ds, i) in tau
                 if (h, st, t, b) == (ha, sa, tree, budget) and (hb, sb, tree, budget, ds, i) in tau]
        if not diffs:
            continue
        mean, se = mean_se(diffs)
        out.append({"compare": spec, "tree": f"{tree}/{budget}", "mean": mean, "se": se, "n": len(diffs)})
    return out


def worker_configs(args: argparse.Namespace) -> int:
    """Configurations one worker holds on CUDA (a graphed decoder each): heads x settings x trees, which
    `run_parallel` turns into the workers that fit in the GPU's memory."""
    return len(args.head) * len(args.settings.split(",")) * len(args.trees.split(","))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="benchmark data directory (default $SPECBENCH_DATA)")
    p.add_argument("--out", required=True, help="JSONL of rows (appended; resumes)")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--head", action="append", required=True, metavar="NAME=DIR",
                   help="a head to replay (jetspec++ checkpoint, or a plain jetspec head); repeatable")
    p.add_argument("--settings", default="J0R0,J1R0,J2R0,J3R0,J1R1,J1R1n")
    p.add_argument("--trees", default="chain:16,ddtree:64", help="POLICY:BUDGET,...")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--n", type=int, default=10, help="items per dataset")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is fastest on a shared CPU)")
    p.add_argument("--minutes", type=float, default=None, help="stop cleanly (between prompts) after this long")
    p.add_argument("--reverse", action="store_true",
                   help="take the prompts from the last: a second process (its own --out) fills from the other end; "
                        "concatenate the two files to merge them (a rerun on the merged file skips what either did)")
    p.add_argument("--shard", default="0/1", help="K/N: only prompts K, K+N, K+2N, ... (of the round-robin order)")
    p.add_argument("--parallel", type=int, default=1,
                   help="run N shards as N processes (OUT.shardK.jsonl each, merged into OUT at the end): on a GPU "
                        "the replay's per-round Python work is the bottleneck, so N processes share one GPU well")
    p.add_argument("--replay", choices=("auto", "device", "host"), default="auto",
                   help="exact replay as the device round (graphed on CUDA: one drafter and decoder per configuration, "
                        "reused across prompts) or as the host walk; auto: device on CUDA")
    p.add_argument("--table-only", action="store_true")
    p.add_argument("--compare", action="append", default=[], metavar="'HEAD SETTING - HEAD SETTING'",
                   help="with --table-only: the paired difference of two configurations over the prompts both have "
                        "(mean +- standard error), per tree; repeatable")
    args = p.parse_args()
    if args.compare and not args.table_only:
        p.error("--compare prints from the rows in --out: add --table-only (a replay run prints only the table)")
    out = Path(args.out)
    if args.parallel > 1 and not args.table_only:
        return run_parallel(args, out, script=__file__, key=ROW_KEY, show=print_table, configs=worker_configs(args))
    rows = read_rows(out)
    if args.table_only:
        print_table(rows)
        for spec in args.compare:
            for d in paired(rows, spec):
                print(f"{d['compare']:<45} {d['tree']:<11} {d['mean']:+.3f} +- {d['se']:.3f}  (n {d['n']})")
        return 0

    from specbench.bench.replay import build_references, replay, replay_decoder
    from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
    from specbench.drafters.jetspecpp.model import load_jetspecpp
    from specbench.models import load_target
    from specbench.trees import TREE_POLICIES

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, device=args.device, dtype="float32")
    heads = {}
    for item in args.head:
        name, _, directory = item.partition("=")
        if not directory:
            raise SystemExit(f"--head takes NAME=DIR, got {item!r}")
        heads[name] = load_jetspecpp(target, directory)
    settings = [s for s in args.settings.split(",") if s]
    trees = [(t.split(":")[0], int(t.split(":")[1])) for t in args.trees.split(",") if t]
    drafters = {}
    for name, (head, adapter) in heads.items():
        for s in settings:
            cfg = parse_setting(s)
            if adapter is None and cfg["R"] > 0 and cfg["states"] == "predicted":
                print(f"jetspecpp_tau: {name} has no adapter: skipping {s}", file=sys.stderr)
                continue
            drafters[(name, s)] = JetSpecPPDrafter(target, head=head, adapter=adapter, **cfg)
    policies = {t: TREE_POLICIES.build(t) for t, _ in trees}
    on_device = args.replay == "device" or (args.replay == "auto" and target.device.type == "cuda")
    decoders = {}  # device replay: a drafter of its own per decoder (the graphs hold its buffers)
    if on_device:
        for (h, s), drafter in drafters.items():
            for tree, budget in trees:
                own = JetSpecPPDrafter(target, head=drafter.head, adapter=drafter.adapter, **parse_setting(s))
                decoders[(h, s, tree, budget)] = replay_decoder(own, policies[tree], budget)
    taps = sorted({t for d in drafters.values() for t in d.taps})
    done = {tuple(r[k] for k in ROW_KEY) for r in rows}
    shard, shards = (int(x) for x in args.shard.split("/"))
    todo = [x for i, x in enumerate(prompts(target, args))
            if i % shards == shard and any((x[0], x[1], h, s, t, b) not in done for (h, s) in drafters for t, b in trees)]
    if args.reverse:
        todo.reverse()
    print(f"jetspecpp_tau: {len(todo)} prompts, {len(drafters) * len(trees)} configurations each", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(out, "a") as f:
        def out_of_time() -> bool:
            return args.minutes is not None and time.monotonic() - start > 60 * args.minutes

        for k, (ds, pid, ids) in enumerate(todo):
            if out_of_time():
                break
            ref = build_references(target, [ids], args.max_new_tokens, taps)[0]
            for (h, s), drafter in drafters.items():
                for tree, budget in trees:
                    if (ds, pid, h, s, tree, budget) in done or out_of_time():
                        continue  # past the budget mid-prompt: the rest of this prompt is a rerun's
                    t0 = time.monotonic()
                    decoder = decoders.get((h, s, tree, budget))
                    res = replay(decoder.drafter if decoder else drafter, ref, policies[tree], budget, args.max_new_tokens,
                                 decoder=decoder)
                    row = {"dataset": ds, "id": pid, "head": h, "setting": s, "tree": tree, "budget": budget,
                           "tau": res.tau, "rounds": len(res.accepted), "new_tokens": len(res.output),
                           "tf_mismatch": ref.tf_mismatch, "time_s": round(time.monotonic() - t0, 2),
                           "max_new_tokens": args.max_new_tokens}
                    f.write(json.dumps(row) + "\n")
                    f.flush()  # every configuration's row survives a kill (a prompt of many heads takes minutes)
                    rows.append(row)
            print(f"jetspecpp_tau: {k + 1}/{len(todo)} {ds}/{pid} (total {time.monotonic() - start:.0f}s)",
                  file=sys.stderr, flush=True)
        if out_of_time():
            print(f"jetspecpp_tau: stopped at the {args.minutes} min budget", file=sys.stderr)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
