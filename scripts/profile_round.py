"""Where a decode round's time goes: per-stage ms/round and a cProfile of the draft stage.

    python scripts/profile_round.py --device cuda --dtype bfloat16 --configs dflash/ddtree/64,eagle3/eagle2/64
    python scripts/profile_round.py --device cuda --dtype bfloat16 --configs jetspec++/chain/16 --kernels \
        --drafter-args '{"foresight": "on", "B": 16, "J": 1, "R": 1}'    # the pipelined round's kernels

For each drafter/tree/budget: one warm-up request, then `--prompts` timed requests (greedy, GSM8K-like
prompts that ship with the project) with the engine's stage times (CUDA events between the round's
stages), then the same requests under cProfile. On a GPU the functions that wait for the device (`.tolist()`, `.item()`,
`int(tensor)`) absorb the time of the kernels queued before them: read the profile together with the
stage table.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--configs", default="dflash/ddtree/64", help="comma-separated drafter/tree/budget")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--top", type=int, default=22, help="functions shown per profile (by own time)")
    p.add_argument("--no-graphs", action="store_true", help="eager verify forward even on CUDA")
    p.add_argument("--drafter-args", default="{}", type=json.loads,
                   help='JSON drafter_args for every config, e.g. \'{"foresight": "on", "B": 16}\' (jetspec++ pipelined)')
    p.add_argument("--kernels", action="store_true",
                   help="also a torch.profiler table of one request (device kernel time per op)")
    args = p.parse_args()

    from specbench.config import SpecConfig
    from specbench.data import turn_prompt_ids
    from specbench.data.benchmarks import builtin
    from specbench.engine import SpecDecoder
    from specbench.models import load_target

    torch.set_grad_enabled(False)
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    prompts = [turn_prompt_ids(target, p, 0, []) for p in builtin()[: args.prompts]]
    print(f"{target.name} on {args.device} {args.dtype}, {len(prompts)} prompts x {args.max_new_tokens} tokens")
    for item in args.configs.split(","):
        drafter, tree, budget = item.split("/")
        spec = SpecConfig(drafter=drafter, tree=tree, budget=int(budget), drafter_args=args.drafter_args)
        decoder = SpecDecoder(target, spec, max_seq_len=1024, cuda_graphs=False if args.no_graphs else None)
        decoder.generate(prompts[0], 16)  # warm-up (graph capture, allocator)
        per_stage: dict[str, list[float]] = {}
        rounds = tokens = 0
        for ids in prompts:
            res = decoder.generate(ids, args.max_new_tokens)
            for r in res.stats.rounds:
                for stage, sec in r.times.items():
                    per_stage.setdefault(stage, []).append(1e3 * sec)
            rounds += len(res.stats.rounds)
            tokens += res.stats.new_tokens
        line = " ".join(f"{s} {statistics.mean(v):.2f}" for s, v in per_stage.items())
        print(f"\n== {item}: tau {tokens / max(rounds, 1):.2f}, ms/round (mean): {line}")
        prof = cProfile.Profile()
        prof.enable()
        for ids in prompts:
            decoder.generate(ids, args.max_new_tokens)
        if target.device.type == "cuda":
            torch.cuda.synchronize()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.top)
        print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[-6000:])
        if args.kernels:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if target.device.type == "cuda" else [])
            with profile(activities=activities) as kprof:
                decoder.generate(prompts[0], args.max_new_tokens)
                if target.device.type == "cuda":
                    torch.cuda.synchronize()
            key = "self_cuda_time_total" if target.device.type == "cuda" else "self_cpu_time_total"
            print(kprof.key_averages().table(sort_by=key, row_limit=args.top, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
