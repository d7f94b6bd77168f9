"""The `specbench` command.

  specbench generate   decode one prompt (AR or speculative) and print the text and stats
  specbench list       every registered component, by kind
  specbench tree       draw the draft tree of one round (PNG), accepted path highlighted
  specbench run/table/plot   experiments (specbench.bench.cli)
  specbench train      train a draft head (specbench.train.cli)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from specbench.config import ConfigError, SamplingConfig, SpecConfig, parse_value
from specbench.registry import RegistryError

# Modules that add their own subcommands through `register(subparsers)`.
SUBCOMMAND_MODULES = ("specbench.bench.cli", "specbench.train.cli")


class UsageError(Exception):
    """Bad command-line input: printed as `specbench: error: ...`, exit status 2."""


def _kv_pairs(items: Sequence[str] | None, flag: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or ():
        if "=" not in item:
            raise UsageError(f"{flag} takes key=value, got {item!r}")
        key, _, raw = item.partition("=")
        out[key.strip()] = parse_value(raw)
    return out


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="target name: smollm2-135m (default, or $SPECBENCH_TARGET), gguf:PATH, hf:DIR, random:PRESET")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--attention", default="auto", help="attention backend: auto (triton on CUDA, else sdpa), sdpa (reference) or triton")
    p.add_argument("--max-seq-len", type=int, default=2048, help="tokens the static KV cache holds")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", default=None, help="drafter name (omit for plain AR decoding)")
    p.add_argument("--tree", default="chain", help="tree policy name")
    p.add_argument("--verifier", default="greedy", help="verifier name")
    p.add_argument("--budget", type=int, default=8, help="draft nodes per round, root excluded")
    p.add_argument("--drafter-arg", action="append", metavar="K=V", help="drafter constructor argument (repeatable)")
    p.add_argument("--tree-arg", action="append", metavar="K=V", help="tree policy argument (repeatable)")
    p.add_argument("--verifier-arg", action="append", metavar="K=V", help="verifier argument (repeatable)")
    p.add_argument("--allow-lossy", action="store_true", help="permit a verifier that is not lossless")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--prompt", required=True, help="user message (formatted with the target's chat template)")
    p.add_argument("--raw", action="store_true", help="tokenize the prompt as is, without the chat template")


def spec_from_args(args: argparse.Namespace) -> tuple[SpecConfig, SamplingConfig]:
    """Validate everything that can be validated before loading a model."""
    from specbench.drafters import DRAFTERS
    from specbench.trees import TREE_POLICIES
    from specbench.verify import VERIFIERS

    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    spec = SpecConfig(
        drafter=args.drafter, tree=args.tree, verifier=args.verifier, budget=args.budget,
        drafter_args=_kv_pairs(args.drafter_arg, "--drafter-arg"), tree_args=_kv_pairs(args.tree_arg, "--tree-arg"),
        verifier_args=_kv_pairs(args.verifier_arg, "--verifier-arg"), allow_lossy=args.allow_lossy,
    )
    if spec.drafter is not None:
        DRAFTERS.get(spec.drafter)
    TREE_POLICIES.get(spec.tree)
    VERIFIERS.get(spec.verifier)
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    return spec, sampling


def _load(args: argparse.Namespace) -> Any:
    from specbench.models import load_target

    return load_target(args.target, device=args.device, dtype=args.dtype, attention=args.attention)


def _prompt_ids(target: Any, args: argparse.Namespace) -> list[int]:
    return target.encode(args.prompt) if args.raw else target.encode_chat(args.prompt)


def cmd_generate(args: argparse.Namespace) -> int:
    from specbench.engine import SpecDecoder

    spec, sampling = spec_from_args(args)
    target = _load(args)
    decoder = SpecDecoder(target, spec, max_seq_len=args.max_seq_len)
    ids = _prompt_ids(target, args)
    result = decoder.generate(ids, args.max_new_tokens, sampling)
    text = target.decode(result.tokens)
    summary = result.stats.summary()
    if args.json:
        print(json.dumps({
            "prompt": args.prompt, "prompt_ids": result.prompt_ids, "token_ids": result.tokens, "text": text,
            "stats": summary, "config": {"target": target.name, "fingerprint": target.fingerprint,
                                         "spec": _plain(spec), "sampling": _plain(sampling)},
        }))
    else:
        print(text)
        print("---")
        print(f"target={target.name} drafter={spec.drafter or 'none (AR)'} tree={spec.tree} verifier={spec.verifier} "
              f"budget={spec.budget if spec.drafter else 0}")
        print(f"new tokens {summary['new_tokens']} ({summary['stop_reason']}), rounds {summary['rounds']}, "
              f"tau {summary['tau']:.3f}, decode {summary['decode_tok_s']:.1f} tok/s, "
              f"end-to-end {summary['e2e_tok_s']:.1f} tok/s, prefill {summary['prefill_s'] * 1e3:.1f} ms")
        stages = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in summary["stage_s"].items())
        print(f"stage totals: {stages}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    import importlib

    from specbench.drafters import DRAFTERS
    from specbench.models import PRESETS, TARGETS
    from specbench.trees import TREE_POLICIES
    from specbench.verify import VERIFIERS

    rows: list[tuple[str, list[str]]] = [
        ("targets", TARGETS.names() + ["gguf:PATH", "hf:DIR"] + [f"random:{p}" for p in sorted(PRESETS)]),
        ("drafters", DRAFTERS.names()),
        ("tree policies", TREE_POLICIES.names()),
        ("verifiers", VERIFIERS.names()),
    ]
    for title, module, attr in (("datasets", "specbench.data", "DATASETS"), ("training objectives", "specbench.train", "OBJECTIVES")):
        registry = getattr(importlib.import_module(module), attr)
        rows.append((title, registry.names()))
    for title, names in rows:
        print(f"{title}: {', '.join(names)}")
    return 0


def cmd_tree(args: argparse.Namespace) -> int:
    from specbench.engine import SpecDecoder
    from specbench.trees.draw import draw_tree

    spec, sampling = spec_from_args(args)
    if spec.drafter is None:
        raise UsageError("specbench tree needs --drafter (plain AR decoding has no draft tree)")
    if args.round < 1:
        raise UsageError(f"--round counts from 1, got {args.round}")
    target = _load(args)
    decoder = SpecDecoder(target, spec, max_seq_len=args.max_seq_len)
    captured: dict[str, Any] = {}

    def keep(round_no: int, tree: Any, result: Any) -> None:
        if round_no == args.round:
            captured.update(tree=tree, result=result)

    decoder.generate(_prompt_ids(target, args), args.max_new_tokens, sampling, on_round=keep)
    if not captured:
        raise UsageError(f"the request finished before round {args.round}; pick an earlier --round or raise --max-new-tokens")
    tree, result = captured["tree"], captured["result"]
    labels = [target.decode([t]) if target.tokenizer is not None else str(t) for t in tree.host[0]]
    bonus = target.decode([result.tokens[-1]]) if target.tokenizer is not None else str(result.tokens[-1])
    draw_tree(tree, labels, result.path, args.out, bonus=bonus)
    print(f"round {args.round}: {tree.num_nodes - 1} draft nodes, accepted {len(result.path) - 1} "
          f"({' '.join(repr(labels[i]) for i in result.path[1:])}); wrote {args.out}")
    return 0


def _plain(obj: Any) -> Any:
    import dataclasses

    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in dataclasses.asdict(obj).items()}


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="specbench", description="Speculative-decoding testbed.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode one prompt and print text + stats")
    add_model_args(gen)
    add_spec_args(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object (prompt, ids, text, stats)")
    gen.set_defaults(func=cmd_generate)

    lst = sub.add_parser("list", help="list registered components")
    lst.set_defaults(func=cmd_list)

    tree = sub.add_parser("tree", help="draw the draft tree of one round as a PNG")
    add_model_args(tree)
    add_spec_args(tree)
    tree.add_argument("--round", type=int, default=1, help="which round to draw (1 = first)")
    tree.add_argument("--out", default="tree.png", help="output PNG path")
    tree.set_defaults(func=cmd_tree, max_new_tokens=64)

    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `specbench run STUDY --device cuda n=5`: key=value overrides may follow options too.
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = list(args.overrides) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args) or 0)
    except (UsageError, ConfigError, RegistryError, ValueError, FileNotFoundError) as exc:
        print(f"specbench: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # model loading and numerical failures: say what, not a traceback
        from specbench.engine import NonFiniteLogitsError
        from specbench.models.loader import ModelLoadError

        if isinstance(exc, (ModelLoadError, NonFiniteLogitsError)):
            print(f"specbench: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
