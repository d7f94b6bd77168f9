"""Exact replay's two paths on the same references, timed: the host walk and the device round (graphed on
CUDA), which `tau_table.py` and `jetspecpp_tau.py` choose with `--replay`.

    python scripts/bench_replay.py --device cuda --data DATA --n 3 \\
        --configs dflash/ddtree/64,jetspec/chain/16,eagle3/eagle2/64,jetspec++/chain/16 --out replay.json

For each DRAFTER/TREE/BUDGET (shipped heads, fp32, T = 0, the first N items of each --datasets benchmark): one
drafter and decoder per path; every reference is replayed once by each path to warm up (the device round
captures its graphs then), then timed; prints seconds per replay and per round of each path, the ratio,
and whether every round's accepted count agrees (`agree`: the device round drafts as decoding does, the host
walk may draft from tables precomputed along the reference; tests/spine/test_capturable.py checks they agree).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tau_table import prompt_order  # noqa: E402


def timed_replays(drafter, refs, policy, budget: int, new: int, on_device: bool) -> tuple[list, list[float]]:  # type: ignore[no-untyped-def]
    """(results, seconds per replay) of `refs` on one decoder, after one untimed replay of each."""
    from specbench.bench.replay import replay, replay_decoder

    decoder = replay_decoder(drafter, policy, budget, replay_on_device=on_device)
    if decoder.replay_on_device != on_device:
        raise SystemExit(f"{drafter.name}/{policy.name}/{budget} does not draft on the device here: no device round")
    for ref in refs:
        replay(drafter, ref, policy, budget, new, decoder=decoder)
    results, seconds = [], []
    for ref in refs:
        if drafter.target.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        results.append(replay(drafter, ref, policy, budget, new, decoder=decoder))
        seconds.append(time.perf_counter() - t0)
    return results, seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--data", default=None, help="benchmark data directory (default $SPECBENCH_DATA)")
    p.add_argument("--datasets", default="gsm8k,math500")
    p.add_argument("--n", type=int, default=3, help="items per dataset")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--configs", default="dflash/ddtree/64,jetspec/chain/16,eagle3/eagle2/64,jetspec++/chain/16")
    p.add_argument("--out", default=None, help="JSON of the rows")
    args = p.parse_args()

    from specbench.bench.replay import build_references
    from specbench.drafters import DRAFTERS
    from specbench.models import load_target
    from specbench.trees import TREE_POLICIES

    torch.set_grad_enabled(False)
    target = load_target("smollm2-135m", device=args.device, dtype="float32")
    prompts = [ids for _, _, ids in prompt_order(target, args)]
    rows = []
    for spec in args.configs.split(","):
        name, tree, budget = spec.split("/")
        policy = TREE_POLICIES.build(tree)
        host_drafter, device_drafter = DRAFTERS.build(name, target), DRAFTERS.build(name, target)
        refs = build_references(target, prompts, args.max_new_tokens, host_drafter.taps)
        host, host_s = timed_replays(host_drafter, refs, policy, int(budget), args.max_new_tokens, False)
        dev, dev_s = timed_replays(device_drafter, refs, policy, int(budget), args.max_new_tokens, True)
        rounds = sum(len(r.accepted) for r in host)
        row = {"config": spec, "prompts": len(refs), "rounds": rounds,
               "tau": statistics.mean(r.tau for r in host), "tau_device": statistics.mean(r.tau for r in dev),
               "host_s": sum(host_s), "device_s": sum(dev_s),
               "host_ms_per_round": 1e3 * sum(host_s) / rounds,
               "device_ms_per_round": 1e3 * sum(dev_s) / max(1, sum(len(r.accepted) for r in dev)),
               "agree": all(a.accepted == b.accepted for a, b in zip(host, dev))}
        rows.append(row)
        print(f"{spec:>22}: {rounds} rounds, host {row['host_ms_per_round']:.2f} ms/round, device "
              f"{row['device_ms_per_round']:.2f} ms/round ({row['host_s'] / row['device_s']:.1f}x), tau {row['tau']:.3f} / "
              f"{row['tau_device']:.3f}, every round agrees: {row['agree']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
            json.dump({"device": name, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
