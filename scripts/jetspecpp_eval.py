"""Held-out metrics of a jetspec++ checkpoint's state adapter and training-free decoder (JetSpec++
Tables 7 and 9): per tapped layer the adapter's relative error and cosine (beside stale states), and
the decoder's top-1 agreement with the target's greedy token and KL(p || p_hat), on the target's own
greedy responses to evaluation prompts (never training prompts).

    python scripts/jetspecpp_eval.py --checkpoint runs/jpp/heads/jetspec++ --data ../shared/data --n 8
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a jetspec++ head directory (with an adapter)")
    p.add_argument("--data", default=None, help="benchmark data directory (default $SPECBENCH_DATA)")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--datasets", default="gsm8k,math500,mbpp,humaneval,mt_bench")
    p.add_argument("--n", type=int, default=8, help="prompts per dataset")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--anchors", type=int, default=8, help="blocks per sequence")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="write the report as JSON here too")
    args = p.parse_args()

    from specbench.data import load_dataset, turn_prompt_ids
    from specbench.drafters.jetspecpp.model import load_jetspecpp
    from specbench.engine import generate_batch
    from specbench.models import load_target
    from specbench.train.jetspecpp_eval import evaluate_states
    from specbench.train.regen import TrainingSequence

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, device=args.device, dtype="float32")
    _, adapter = load_jetspecpp(target, args.checkpoint)
    if adapter is None:
        raise SystemExit(f"{args.checkpoint!r} has no state adapter: give a jetspec++ checkpoint trained with adapter=true")
    adapter = adapter.to(target.device).eval()
    ids = [turn_prompt_ids(target, x, 0, []) for name in args.datasets.split(",") for x in load_dataset(name, args.data, n=args.n)]
    seqs = []
    for s in range(0, len(ids), 8):
        chunk = ids[s: s + 8]
        for prompt, response in zip(chunk, generate_batch(target, chunk, args.max_new_tokens)):
            seqs.append(TrainingSequence(prompt=prompt, response=response))
    report = evaluate_states(target, adapter, seqs, anchors_per_seq=args.anchors)
    report["sequences"] = len(seqs)
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    short = {str(t): {k: round(v, 4) for k, v in row.items() if not k.endswith("by_offset")} for t, row in report["taps"].items()}
    print(json.dumps({"blocks": report["blocks"], "taps": short,
                      "decoder": {k: round(v, 5) for k, v in report["decoder"].items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
