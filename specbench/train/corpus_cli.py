"""`specbench corpus`: the training corpus at scale (specbench.train.corpus).

    specbench corpus generate --out CORPUS --data ../shared/data [--temperatures 0,0.7,0.85,1.0] \\
        [--shards 0-3 | --max-shards N] [--minutes M] [--device cuda --gen-batch 512]
    specbench corpus status CORPUS [--json]
    specbench corpus add CORPUS SRC [SRC ...] [--replace]     (stage shards made on another machine)

`generate` makes the corpus on first use and afterwards checks that every setting is the one it was
made with; interrupted anywhere, the same command continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

DEFAULT_SETS = "gsm8k_train,mbpp_train,sharegpt"
DEFAULT_TEMPERATURES = "0,0.7,0.85,1.0"


def parse_shards(text: str | None) -> list[int] | None:
    """"0-3,7" -> [0, 1, 2, 3, 7]."""
    if not text:
        return None
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            out += list(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ValueError(f"--shards takes indices and ranges like 0-3,7; got {text!r}") from None
    return out


def add_generate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="corpus directory (made on first use)")
    p.add_argument("--target", default=None, help="target name (default smollm2-135m or $SPECBENCH_TARGET)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="target dtype (default: float32 on cpu, bfloat16 on cuda); part of the corpus's identity")
    p.add_argument("--data", default=None, help="directory with the training prompt files (default $SPECBENCH_DATA)")
    p.add_argument("--sets", default=DEFAULT_SETS, help=f"training prompt sets (default {DEFAULT_SETS}; synthetic:N "
                                                          f"for random token prompts)")
    p.add_argument("--max-prompt-len", type=int, default=384, help="drop prompts longer than this (tokens)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="response length cap")
    p.add_argument("--temperatures", default=DEFAULT_TEMPERATURES,
                   help=f"one response per value, 0 = greedy (default {DEFAULT_TEMPERATURES})")
    p.add_argument("--seed", type=int, default=0, help="prompt order and sampling seed")
    p.add_argument("--sample-seed", type=int, default=None,
                   help="the sampled responses' seed only (default --seed): the same prompts, shards, greedy responses "
                        "and validation split with fresh samples (a corpus regenerated per session: new data each time)")
    p.add_argument("--shard-size", type=int, default=512, help="prompts per shard")
    p.add_argument("--gen-batch", type=int, default=64, help="prompts per generation batch (recorded per shard)")
    p.add_argument("--shards", default=None, help="only these shards, e.g. 0-3,7 (default: every unfinished one)")
    p.add_argument("--max-shards", type=int, default=None, help="finish at most N shards in this call")
    p.add_argument("--minutes", type=float, default=None, help="stop cleanly (between units) after this long")
    p.add_argument("--quiet", action="store_true")


def cmd_generate(args: argparse.Namespace) -> int:
    from specbench.models import load_target
    from specbench.train import corpus as corpus_mod

    start = time.monotonic()
    deadline = start + 60 * args.minutes if args.minutes else None
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    target = load_target(args.target, device=args.device, dtype=dtype)
    temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    corpus, plan = corpus_mod.open_or_create(
        args.out, target, args.data, sets=[s for s in args.sets.split(",") if s], max_prompt_len=args.max_prompt_len,
        max_new_tokens=args.max_new_tokens, temperatures=temperatures, seed=args.seed, shard_size=args.shard_size,
        sample_seed=args.sample_seed)
    print(f"specbench corpus: {corpus.num_prompts} prompts in {corpus.num_shards} shards of {args.shard_size}, "
          f"{len(corpus.finished())} finished (plan {corpus.digest})", file=sys.stderr)
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    done = corpus_mod.generate(target, corpus, plan, gen_batch=args.gen_batch, shards=parse_shards(args.shards),
                               max_shards=args.max_shards, deadline=deadline, log=log)
    print(f"specbench corpus: finished shards {done} in {time.monotonic() - start:.0f}s; "
          f"{len(corpus.finished())}/{corpus.num_shards} done", file=sys.stderr)
    print(json.dumps({"finished_now": done, "finished": corpus.finished(), "shards": corpus.num_shards}))
    return 0


def format_status(st: dict[str, Any]) -> str:
    spec = st["spec"]
    lines = [f"corpus {st['dir']}: target {spec['target']} ({spec['target_fingerprint']}, {spec['dtype']}), "
             f"sets {','.join(spec['sets'])}, max_new_tokens {spec['max_new_tokens']}, seed {spec['seed']}"
             f"{'' if spec.get('sample_seed') is None else ', sample seed ' + str(spec['sample_seed'])}, plan {st['plan_digest']}",
             f"shards {st['finished_shards']}/{st['shards']} finished ({st['prompts']}/{st['plan_prompts']} prompts); "
             f"partial: {st['partial_units'] or 'none'}; {st['bytes'] / 2**20:.1f} MiB; generation {st['generation_s']:.0f}s",
             f"sequences {st['sequences']:,}  response tokens {st['response_tokens']:,}  prompt tokens "
             f"{st['prompt_tokens']:,} (unique)  sequence tokens {st['sequence_tokens']:,}",
             f"{'temperature':>12}{'sequences':>11}{'resp tokens':>13}{'mean len':>10}{'ended EOS':>11}"]
    for v in st["by_temperature"]:
        n = max(v["sequences"], 1)
        lines.append(f"{v['temperature']:>12g}{v['sequences']:>11,}{v['response_tokens']:>13,}"
                     f"{v['response_tokens'] / n:>10.1f}{v['ended_eos'] / n:>10.1%}")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    from specbench.train.corpus import Corpus, status

    st = status(Corpus.open(args.corpus))
    print(json.dumps(st, indent=2) if args.json else format_status(st))
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    from specbench.train.corpus import Corpus, add

    added = add(args.corpus, args.sources, replace=args.replace, log=lambda m: print(m, file=sys.stderr))
    corpus = Corpus.open(args.corpus)
    print(f"specbench corpus: added shards {added}; {len(corpus.finished())}/{corpus.num_shards} finished")
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("corpus", help="the training corpus: generate (resumable, sharded), status, add shards")
    sub = p.add_subparsers(dest="corpus_command", required=True)
    gen = sub.add_parser("generate", help="answer the training prompts with the target, shard by shard")
    add_generate_args(gen)
    gen.set_defaults(func=cmd_generate)
    st = sub.add_parser("status", help="shards, sequences and tokens the corpus holds")
    st.add_argument("corpus")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)
    ad = sub.add_parser("add", help="stage finished shards (files or directories) into a corpus")
    ad.add_argument("corpus")
    ad.add_argument("sources", nargs="+")
    ad.add_argument("--replace", action="store_true", help="take a shard that differs from the one already there")
    ad.set_defaults(func=cmd_add)
