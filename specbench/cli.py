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
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from specbench.config import ConfigError, RunConfig, SamplingConfig, SpecConfig, parse_value
from specbench.registry import RegistryError

DEFAULT_MAX_SEQ_LEN = 2048  # what SpecDecoder allocates when the target's context is at least this long

# Modules that add their own subcommands through `register(subparsers)`.
SUBCOMMAND_MODULES = ("specbench.bench.cli", "specbench.train.cli")


class UsageError(Exception):
    """Bad command-line input: printed as `specbench: error: ...`, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose own errors (a missing or malformed flag) are one line, as all others."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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
    p.add_argument("--max-seq-len", type=int, default=None,
                   help=f"tokens the static KV cache holds (default: {DEFAULT_MAX_SEQ_LEN} or the target's context if shorter)")
    add_threads_arg(p)


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default on a CPU: 1, by far the fastest for batch-1 decoding on a shared machine; README)")


def set_decode_threads(requested: int | None, device: str) -> str | None:
    """Set torch's CPU threads for batch-1 decoding (once per process); returns the line that says the
    choice, for the caller to print (None on CUDA).

    A decode step of a small model is a chain of small matmuls, and when other work shares the cores
    every multi-threaded step waits for the slowest thread: on a shared 2-core machine 2 threads
    decoded 5-10x slower than 1 (README, "CPU threads"). So on a CPU the default is 1 thread
    ($OMP_NUM_THREADS or --threads overrides it); on CUDA the host threads do little and torch's
    default stays."""
    import torch

    if requested is not None and requested < 1:
        raise UsageError(f"--threads must be >= 1, got {requested}")
    if requested is None and not device.startswith("cpu"):
        return None
    if requested is not None:
        why = "--threads"
    elif os.environ.get("OMP_NUM_THREADS"):
        requested, why = torch.get_num_threads(), "$OMP_NUM_THREADS"
    else:
        requested, why = 1, "the CPU default for batch-1 decoding; --threads N to change"
    torch.set_num_threads(requested)
    return f"specbench: {requested} torch CPU thread{'s' if requested > 1 else ''} ({why})"


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
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="user message (formatted with the target's chat template)")
    source.add_argument("--prompt-file", metavar="PATH", help="read the user message from a UTF-8 file ('-': stdin)")
    p.add_argument("--raw", action="store_true", help="tokenize the prompt as is, without the chat template")


def spec_from_args(args: argparse.Namespace) -> tuple[SpecConfig, SamplingConfig]:
    """Validate everything that can be validated before loading a model: component names and their
    arguments, the verifier against the sampling settings, the drafter against the tree policy, and
    whether the lengths fit the cache."""
    from specbench.drafters import DRAFTERS
    from specbench.models import default_target_name
    from specbench.trees import TREE_POLICIES
    from specbench.verify import VERIFIERS

    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    spec = SpecConfig(
        drafter=args.drafter, tree=args.tree, verifier=args.verifier, budget=args.budget,
        drafter_args=_kv_pairs(args.drafter_arg, "--drafter-arg"), tree_args=_kv_pairs(args.tree_arg, "--tree-arg"),
        verifier_args=_kv_pairs(args.verifier_arg, "--verifier-arg"), allow_lossy=args.allow_lossy,
    )
    max_seq_len = DEFAULT_MAX_SEQ_LEN if args.max_seq_len is None else args.max_seq_len
    RunConfig(target=args.target or default_target_name(), spec=spec, sampling=sampling,
              max_new_tokens=args.max_new_tokens, max_seq_len=max_seq_len, device=args.device, dtype=args.dtype,
              attention=args.attention)  # checks the lengths against the cache
    verifier = _component("--verifier", VERIFIERS, spec.verifier, spec.verifier_args, "--verifier-arg")
    if not verifier.lossless and not spec.allow_lossy:
        raise UsageError(f"--verifier {spec.verifier} is not lossless; add --allow-lossy to run it anyway")
    try:
        verifier.check(sampling)
    except ValueError as exc:
        raise UsageError(f"--verifier {spec.verifier}: {exc}") from None
    _component("--tree", TREE_POLICIES, spec.tree, spec.tree_args, "--tree-arg")
    if spec.drafter is not None:
        drafter_cls = _registered("--drafter", DRAFTERS, spec.drafter)
        _check_arguments(f"--drafter {spec.drafter}", drafter_cls, spec.drafter_args, "--drafter-arg", skip=1)
        drafter_cls.check_policy(spec.tree, sampled=verifier.needs_draft_probs and not sampling.greedy)
    return spec, sampling


def _registered(flag: str, registry: Any, name: str) -> Any:
    try:
        return registry.get(name)
    except RegistryError as exc:
        raise UsageError(f"{flag} {name}: {exc}") from None


def _component(flag: str, registry: Any, name: str, kwargs: Any, arg_flag: str) -> Any:
    """Build a component that needs no model (tree policy, verifier) now, naming the flags in any error."""
    factory = _registered(flag, registry, name)
    _check_arguments(f"{flag} {name}", factory, kwargs, arg_flag)
    try:
        return factory(**dict(kwargs))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{flag} {name} with {arg_flag} {_pairs(kwargs)}: {exc}") from None


def _pairs(kwargs: Any) -> str:
    return " ".join(f"{k}={v}" for k, v in dict(kwargs).items()) or "(none)"


def _check_arguments(what: str, factory: Any, kwargs: Any, arg_flag: str, skip: int = 0) -> None:
    """UsageError unless `factory` takes these keyword arguments (after `skip` positional ones)."""
    import inspect

    try:
        params = list(inspect.signature(factory).parameters.values())[skip:]
    except (TypeError, ValueError):  # no signature to read: the call will tell
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    takes = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(kwargs) - set(takes))
    if unknown:
        raise UsageError(f"{arg_flag} {unknown[0]}=...: {what} takes no argument {unknown[0]!r} "
                         f"(it takes: {', '.join(takes) or 'none'})")


def _prompt_source(args: argparse.Namespace) -> str:
    return "--prompt" if args.prompt_file is None else f"--prompt-file {args.prompt_file}"


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt from --prompt or --prompt-file (PATH, or '-' for stdin), checked to be UTF-8."""
    from specbench.models.target import PromptError, prompt_text

    if args.prompt_file is None:
        data = os.fsencode(args.prompt)  # the argument's bytes as the shell passed them
    else:
        try:
            data = sys.stdin.buffer.read() if args.prompt_file == "-" else Path(args.prompt_file).read_bytes()
        except OSError as exc:
            raise UsageError(f"{_prompt_source(args)}: cannot read it ({exc.strerror or exc})") from None
    try:
        text = prompt_text(data)
    except PromptError as exc:
        raise UsageError(f"{_prompt_source(args)}: {exc}") from None
    if args.raw and not text:
        raise UsageError(f"{_prompt_source(args)}: the prompt is empty (with --raw there is nothing to tokenize)")
    return text


def _load(args: argparse.Namespace) -> tuple[Any, str | None]:
    """(target, the line that says the CPU threads: printed once decoding starts, so that a failure
    before that is one line)."""
    from specbench.models import load_target

    threads = set_decode_threads(args.threads, args.device)
    return load_target(args.target, device=args.device, dtype=args.dtype, attention=args.attention), threads


def _say(line: str | None) -> None:
    if line:
        print(line, file=sys.stderr)


def _decoder(target: Any, spec: SpecConfig, args: argparse.Namespace) -> Any:
    """The SpecDecoder. A drafter's own argument checks run once the model is loaded; they name --drafter."""
    from specbench.drafters import DRAFTERS
    from specbench.engine import SpecDecoder

    drafter = None
    if spec.drafter is not None:
        try:
            drafter = DRAFTERS.build(spec.drafter, target, **dict(spec.drafter_args))
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise UsageError(f"--drafter {spec.drafter} with --drafter-arg {_pairs(spec.drafter_args)}: {exc}") from None
    return SpecDecoder(target, spec, max_seq_len=args.max_seq_len, drafter=drafter)


def _prompt_ids(target: Any, args: argparse.Namespace, prompt: str) -> list[int]:
    from specbench.models.target import PromptError

    try:
        return target.encode(prompt) if args.raw else target.encode_chat(prompt)
    except PromptError as exc:
        raise UsageError(f"{_prompt_source(args)}: {exc}") from None


def _prepared(args: argparse.Namespace, spec: Any) -> tuple[str, Any, Any, list[int]]:
    """The prompt read, the target and decoder built, the request checked (before any decoding):
    what `generate` and `tree` both start from."""
    prompt = read_prompt(args)
    target, threads = _load(args)
    decoder = _decoder(target, spec, args)
    ids = _prompt_ids(target, args, prompt)
    decoder.check_request(len(ids), args.max_new_tokens)
    _say(threads)
    return prompt, target, decoder, ids


def cmd_generate(args: argparse.Namespace) -> int:
    spec, sampling = spec_from_args(args)
    prompt, target, decoder, ids = _prepared(args, spec)
    result = decoder.generate(ids, args.max_new_tokens, sampling)
    text = target.decode(result.tokens)
    summary = result.stats.summary()
    if args.json:
        print(json.dumps({
            "prompt": prompt, "prompt_ids": result.prompt_ids, "token_ids": result.tokens, "text": text,
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
    from specbench.trees.draw import draw_tree

    spec, sampling = spec_from_args(args)
    if spec.drafter is None:
        raise UsageError("specbench tree needs --drafter (plain AR decoding has no draft tree)")
    if args.round < 1:
        raise UsageError(f"--round counts from 1, got {args.round}")
    _, target, decoder, ids = _prepared(args, spec)
    captured: dict[str, Any] = {}

    def keep(round_no: int, tree: Any, result: Any) -> None:
        if round_no == args.round:
            captured.update(tree=tree, result=result)

    decoder.generate(ids, args.max_new_tokens, sampling, on_round=keep)
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

    parser = Parser(prog="specbench", description="Speculative-decoding testbed.")
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
        print(f"specbench: error: {flag_message(exc, args)}", file=sys.stderr)
        return 2
    except Exception as exc:  # model loading and numerical failures: say what, not a traceback
        from specbench.engine import NonFiniteLogitsError
        from specbench.models.loader import ModelLoadError

        if isinstance(exc, (ModelLoadError, NonFiniteLogitsError)):
            print(f"specbench: error: {flag_message(exc, args)}", file=sys.stderr)
            return 2
        raise


# Configuration keys whose flag is not `--` + the key with dashes (the value is the flag's argparse dest).
FLAG_ALIASES = {"drafter_args": "drafter_arg", "tree_args": "tree_arg", "verifier_args": "verifier_arg",
                "data_dir": "data"}


def flag_message(exc: BaseException, args: argparse.Namespace) -> str:
    """The error as one line, the configuration keys it names (`ConfigError.keys`) spelled as the
    flags of the command that ran: max_seq_len -> --max-seq-len, allow_lossy=True -> --allow-lossy,
    drafter_args checkpoint=DIR -> --drafter-arg checkpoint=DIR. Keys the command has no flag for
    (a study's settings, given as key=value overrides) stay as they are."""
    options = vars(args)

    def flag_of(key: str) -> str | None:
        for dest in (key, FLAG_ALIASES.get(key)):
            if dest is not None and dest in options:
                return "--" + dest.replace("_", "-")
        return None

    text = exc.spelled(flag_of) if isinstance(exc, ConfigError) else str(exc)
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
