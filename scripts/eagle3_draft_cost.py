"""Drafting cost per round as a function of depth: eagle3 (one head pass per depth) next to jetspec
(one pass over a block of depth+1 whatever the depth), on a real target, in the real decode loop.

For each depth d = 1..D it decodes one prompt with budget d and reads, per round, the engine's
"draft" stage time (head passes + the context feed of the newly committed tokens + tree building;
on CUDA the stage timer synchronises) and the number of head forward passes (a forward hook on the
drafter's head). The verify forward of the same round is shown for scale. Head weights may be random
(the cost does not depend on them): with random heads almost nothing is accepted, so every round
feeds one committed token, the steady state of a poorly matched head.

    python scripts/eagle3_draft_cost.py                                   # CPU, fp32, SmolLM2
    python scripts/eagle3_draft_cost.py --device cuda --out $OUT          # the lead's H200 run (bf16)

Series: eagle3/chain (d passes), eagle3/eagle2 (top_k 10, max_depth d, budget 64: d passes, each
over up to 10 frontier nodes), jetspec/chain (block_size d+1: one pass). jetspec is skipped with a
note when its drafter is not available. Full per-round records go to --out (JSON); the table is last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

PROMPT = "Explain how a bicycle gear system works, then give three tips for climbing hills."


def eagle3_drafter(target, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from specbench.drafters.eagle3.drafter import Eagle3Drafter

    if args.eagle3_checkpoint:
        return Eagle3Drafter(target, checkpoint=args.eagle3_checkpoint)
    return Eagle3Drafter(target, random_init=True, draft_vocab=args.draft_vocab)


def jetspec_drafter(target, args: argparse.Namespace, depth: int):  # type: ignore[no-untyped-def]
    """A jetspec drafter running a block of depth+1 (anchor + depth MASK inputs), or None + why not."""
    try:
        from specbench.drafters.heads.backbone import DraftHead, HeadConfig, default_taps
        from specbench.drafters.heads.drafter import load_trained_head
        from specbench.drafters.heads.parallel import JetSpecDrafter
    except ImportError as exc:
        return None, f"jetspec drafter not available ({exc})"
    if args.jetspec_checkpoint:
        head = load_trained_head("jetspec", target, args.jetspec_checkpoint)
    else:
        cfg = HeadConfig(drafter="jetspec", taps=default_taps(target.config.num_layers, 3), num_layers=1,
                         block_size=args.max_depth + 1, attention="block-causal")
        head = DraftHead(target.config, cfg).to(target.device).init_weights(target.model)
    if depth + 1 > head.config.block_size:
        return None, f"jetspec head trained with block {head.config.block_size}: depth {depth} needs {depth + 1}"
    return JetSpecDrafter(target, head=head, block_size=depth + 1), ""


def measure(target, drafter, tree: str, tree_args: dict, budget: int, depth: int, prompt: list[int], rounds: int,
            warmup: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Per-round draft/verify times and head passes over `rounds` rounds, each request's first `warmup`
    rounds discarded. A well-matched (trained) head commits several tokens per round: requests are
    lengthened by the tokens per round seen so far and repeated until enough rounds were recorded."""
    from specbench.config import SpecConfig
    from specbench.engine import SpecDecoder

    spec = SpecConfig(drafter=drafter.name, tree=tree, tree_args=tree_args, budget=budget)
    most = (warmup + rounds + 1) * (depth + 1)  # new tokens that always give enough rounds
    decoder = SpecDecoder(target, spec, max_seq_len=min(target.config.max_position_embeddings,
                                                        len(prompt) + most + budget + 8), drafter=drafter)
    calls = [0]
    passes: list[int] = []

    def on_round(round_no, tree_, result):  # type: ignore[no-untyped-def]
        passes.append(calls[0])
        calls[0] = 0

    records, kept_passes = [], []
    per_round = 1.0  # tokens committed per round, as observed
    hook = drafter.head.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        for _ in range(20):
            passes.clear()
            want = warmup + rounds - len(records) + 1
            result = decoder.generate(prompt, min(most, math.ceil(want * per_round) + 1), on_round=on_round)
            stats = result.stats
            per_round = max(per_round, stats.new_tokens / max(1, len(stats.rounds)))
            records += stats.rounds[warmup:]
            kept_passes += passes[warmup:]
            if len(records) >= rounds:
                break
    finally:
        hook.remove()
    if len(records) < rounds:
        raise RuntimeError(f"only {len(records)} rounds after warm-up in 20 requests (the prompt's answer ends early?)")
    records, kept_passes = records[:rounds], kept_passes[:rounds]
    draft = [r.times.get("draft", 0.0) for r in records]
    verify = [r.times.get("verify_forward", 0.0) for r in records]
    return {"rounds": len(records), "passes": statistics.mean(kept_passes),
            "draft_ms": 1e3 * statistics.median(draft), "verify_ms": 1e3 * statistics.median(verify),
            "tau": sum(r.accepted + 1 for r in records) / len(records),
            "draft_ms_all": [1e3 * x for x in draft], "verify_ms_all": [1e3 * x for x in verify]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="default: float32 on cpu, bfloat16 on cuda")
    p.add_argument("--max-depth", type=int, default=16)
    p.add_argument("--rounds", type=int, default=12, help="measured rounds per depth and series")
    p.add_argument("--warmup", type=int, default=3, help="rounds discarded at the start of each request")
    p.add_argument("--draft-vocab", type=int, default=4096, help="random eagle3 head's draft vocabulary")
    p.add_argument("--eagle3-checkpoint", default=None, help="a trained eagle3 head (default: random weights)")
    p.add_argument("--jetspec-checkpoint", default=None, help="a trained jetspec head (default: random weights)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--out", default=os.environ.get("OUT"), help="directory for the JSON results")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")

    from specbench.models import load_target

    start = time.monotonic()
    load_before = os.getloadavg()[0]
    target = load_target(args.target, device=args.device, dtype=dtype)
    prompt = target.encode_chat(PROMPT) if target.tokenizer is not None else list(range(1, 40))
    eagle3 = eagle3_drafter(target, args)
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    with torch.inference_mode():
        measure(target, eagle3, "chain", {}, 4, 4, prompt, 4, 1)  # warm up kernels / allocator once
        for depth in range(1, args.max_depth + 1):
            series = [("eagle3/chain", eagle3, "chain", {}, depth),
                      ("eagle3/eagle2", eagle3, "eagle2", {"top_k": 10, "max_depth": depth}, 64)]
            jet, why = jetspec_drafter(target, args, depth)
            if jet is None:
                if why not in notes:
                    notes.append(why)
            else:
                series.append(("jetspec/chain", jet, "chain", {}, depth))
            for label, drafter, tree, tree_args, budget in series:
                rec = measure(target, drafter, tree, tree_args, budget, depth, prompt, args.rounds, args.warmup)
                rows.append({"series": label, "depth": depth, "budget": budget, **rec})
                print(f"  {label:<14} depth {depth:>2}: {rec['passes']:.1f} passes, draft {rec['draft_ms']:.2f} ms, "
                      f"verify {rec['verify_ms']:.2f} ms, tau {rec['tau']:.2f}", file=sys.stderr, flush=True)

    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({torch.get_num_threads()} threads)"
    meta = {"target": args.target, "device": device_name, "dtype": dtype, "prompt_tokens": len(prompt),
            "eagle3_head": args.eagle3_checkpoint or f"random (draft vocab {args.draft_vocab})",
            "jetspec_head": args.jetspec_checkpoint or "random (1 layer, 3 taps)", "notes": notes,
            "wall_s": round(time.monotonic() - start, 1), "torch": torch.__version__,
            "loadavg_1min_start_end": [load_before, os.getloadavg()[0]]}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "eagle3_draft_cost.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    labels = sorted({r["series"] for r in rows}, key=lambda s: ["eagle3/chain", "eagle3/eagle2", "jetspec/chain"].index(s))
    by = {(r["series"], r["depth"]): r for r in rows}
    print(f"\ndrafting cost per round (median ms; passes = head forward passes per round) on {device_name}, "
          f"{args.target} {dtype}, prompt {len(prompt)} tokens")
    header = f"{'depth':>5}" + "".join(f"{s + ' passes':>22}{s + ' ms':>18}" for s in labels) + f"{'verify(d+1) ms':>16}"
    print(header)
    for depth in range(1, args.max_depth + 1):
        line = f"{depth:>5}"
        for s in labels:
            r = by.get((s, depth))
            line += f"{r['passes']:>22.1f}{r['draft_ms']:>18.2f}" if r else f"{'-':>22}{'-':>18}"
        line += f"{by[('eagle3/chain', depth)]['verify_ms']:>16.2f}"
        print(line)
    for note in notes:
        print(f"note: {note}")
    print(f"wall {meta['wall_s']} s; 1-min load average at start/end {load_before:.1f}/{os.getloadavg()[0]:.1f} "
          f"(other processes on the machine inflate CPU times)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
