"""Spine benchmark (issue 2): native AR decoding against transformers' `generate` on the same weights,
then tau and tok/s of the `ngram` and `self` drafters on GSM8K test questions.

    python scripts/bench_spine.py --data-dir ../shared/data                      # this CPU, fp32
    python scripts/bench_spine.py --device cuda --dtype bfloat16 --target gguf:/root/stage/smollm2.gguf

Timing: wall clock around whole requests (prefill + decode, "end-to-end"), after every prompt has been
run once untimed (warm-up on the lengths each implementation will see: transformers' static cache
recompiles per new prompt length); decode-only tok/s from the engine's own stats. Greedy, so both implementations must emit the same tokens
(checked: a mismatch is reported per prompt, fp32 only — bf16 may flip near-ties).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specbench.config import SpecConfig
from specbench.data import load_dataset
from specbench.engine import SpecDecoder
from specbench.models import load_target

AR_PROMPTS = [
    "Explain why the sky is blue in a short paragraph.",
    "Write a Python function that merges two sorted lists.",
    "Give me a recipe for pancakes.",
    "What is the capital of Australia, and why was it chosen?",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did she sell altogether?",
]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def hf_generate_fn(target, device: str, dtype: str, static: bool):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target.meta["source"], dtype=getattr(torch, dtype)).to(device).eval()

    def run(ids: list[int], n: int) -> list[int]:
        x = torch.tensor([ids], device=device)
        kw = {"cache_implementation": "static"} if static else {}
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                 pad_token_id=target.eos_token_ids[0], **kw)
        return out[0, len(ids):].tolist()

    return run


def time_requests(fn, prompts: list[list[int]], n: int, device: str) -> tuple[list[list[int]], float, int]:
    """Every prompt once untimed (each implementation warms up on exactly the shapes it will see:
    transformers' static cache compiles per prompt length), then every prompt timed, wall clock per
    request with a device sync on both sides (prefill included)."""
    for ids in prompts:
        fn(ids, n)
    outs, total_t, total_tok = [], 0.0, 0
    for ids in prompts:
        sync(device)
        t0 = time.perf_counter()
        toks = fn(ids, n)
        sync(device)
        total_t += time.perf_counter() - t0
        total_tok += len(toks)
        outs.append(toks)
    return outs, total_t, total_tok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--data-dir", default=None, help="holds gsm8k_test.jsonl (else $SPECBENCH_DATA)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=len(AR_PROMPTS), help="AR prompts for the implementation table")
    ap.add_argument("--gsm8k", type=int, default=20, help="GSM8K test questions for the drafter table")
    ap.add_argument("--budgets", default="4,8")
    ap.add_argument("--skip-hf-static", action="store_true")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    hw = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"target {target.name} on {hw}, {args.dtype}, torch {torch.__version__}")
    report: dict = {"hardware": hw, "dtype": args.dtype, "ar": {}, "drafters": []}

    # ---- AR: native vs transformers ------------------------------------------------------
    prompts = [target.encode_chat(p) for p in AR_PROMPTS[: args.prompts]]
    native = SpecDecoder(target, SpecConfig(), max_seq_len=1024)
    decode_rates: list[float] = []

    def native_fn(ids, n):
        res = native.generate(ids, n)
        decode_rates.append(res.stats.decode_tokens_per_s)
        return res.tokens

    ref_out, t, n_tok = time_requests(native_fn, prompts, args.new_tokens, args.device)
    timed = decode_rates[len(prompts):]  # the timed pass
    rows = [("native (specbench)", n_tok / t, statistics.median(timed))]
    report["ar"]["native"] = {"tok_s": n_tok / t, "decode_tok_s_median": statistics.median(timed), "tokens": n_tok}
    variants = [("transformers generate, dynamic cache", False)] + ([] if args.skip_hf_static else [("transformers generate, static cache", True)])
    for label, static in variants:
        try:
            outs, t, n_tok = time_requests(hf_generate_fn(target, args.device, args.dtype, static), prompts, args.new_tokens, args.device)
        except Exception as exc:  # report, don't hide
            print(f"{label}: failed: {type(exc).__name__}: {exc}")
            continue
        same = sum(o == r for o, r in zip(outs, ref_out))
        rows.append((label + f" (same tokens on {same}/{len(outs)} prompts)", n_tok / t, float("nan")))
        print(f"{label}: {n_tok / t:.1f} tok/s end to end, same tokens as native on {same}/{len(outs)}", flush=True)
        report["ar"][label] = {"tok_s": n_tok / t, "same_tokens": same, "tokens": n_tok}
    print(f"\nAR decoding, greedy, {len(prompts)} prompts, up to {args.new_tokens} new tokens")
    print(f"| implementation | end-to-end tok/s | native decode-only tok/s (median) |\n|---|---|---|")
    for label, e2e, dec in rows:
        print(f"| {label} | {e2e:.1f} | {dec:.1f} |" if dec == dec else f"| {label} | {e2e:.1f} | - |")

    # ---- drafters on GSM8K ---------------------------------------------------------------
    questions = load_dataset("gsm8k", data_dir=args.data_dir, n=args.gsm8k)
    q_ids = [target.encode_chat(item.turns[0]) for item in questions]
    configs = [("AR", None, 0, {})] + [(d, d, b, {}) for d in ("ngram", "self") for b in map(int, args.budgets.split(","))]
    print(f"\nGSM8K test, first {len(q_ids)} questions, greedy, {args.new_tokens} new tokens")
    print("| drafter | budget | tau | decode tok/s | end-to-end tok/s | speed-up (decode) |\n|---|---|---|---|---|---|")
    ar_rate = None
    for label, drafter, budget, dargs in configs:
        dec = SpecDecoder(target, SpecConfig(drafter=drafter, budget=max(budget, 1), drafter_args=dargs), max_seq_len=1024)
        dec.generate(q_ids[0], 8)
        taus, rounds, dtime, ttime, toks = [], 0, 0.0, 0.0, 0
        for ids in q_ids:
            s = dec.generate(ids, args.new_tokens).stats
            taus.append(s.tau * len(s.rounds))
            rounds += len(s.rounds)
            dtime += s.decode_time
            ttime += s.total_time
            toks += s.new_tokens
        tau = sum(taus) / rounds
        rate = (toks - len(q_ids)) / dtime
        ar_rate = ar_rate or rate
        print(f"| {label} | {budget or '-'} | {tau:.3f} | {rate:.1f} | {toks / ttime:.1f} | {rate / ar_rate:.2f}x |")
        report["drafters"].append({"drafter": label, "budget": budget, "tau": tau, "decode_tok_s": rate,
                                   "e2e_tok_s": toks / ttime, "speedup_decode": rate / ar_rate})
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
