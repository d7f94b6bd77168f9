"""The verifier table (issue 3's closing note): for every registered verifier,

  exact   : lossless proven by the exact test? Runs exact_law on random cases now (fixed point-mass trees,
            trees sampled with and without replacement, chains; vocabularies 2-6 with zeros and ties) and
            reports "yes" when every emitted next token follows the target to 1e-12, else the largest gap.
  MC p    : Monte-Carlo agreement of `verify` (TorchRandomness, vectorised where available) with exact_law:
            chi-square p-value, Bonferroni-adjusted over the verifier's cases.
  tau     : mean tau (tokens per verify pass, bonus included; pooled over all rounds) on the first
            --questions GSM8K test questions (chat template), T = 1, drafter `self`, budget 8,
            --new-tokens new tokens, seed = question index. `greedy` needs T = 0: n/a.

    python scripts/verifier_table.py --data /work/shared/data --threads 1 --out verifier_table.json

The table is printed last (markdown); --out writes every number as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import torch

from specbench.config import SamplingConfig, SpecConfig
from specbench.trees.base import DraftTree
from specbench.verify import (
    VERIFIERS,
    TorchRandomness,
    exact_law,
    law_gap,
    next_token_gap,
    sample_tree,
    target_law,
)
from specbench.verify.exact import target_rows

TOL = 1e-12


def random_law(seed: int, vocab: int) -> torch.Tensor:
    """A law [vocab] float64 of one of four kinds: dense, sparse, one-hot, exact ties."""
    g = torch.Generator().manual_seed(seed)
    kind = int(torch.randint(0, 4, (1,), generator=g))
    w = torch.rand(vocab, generator=g, dtype=torch.float64) ** 2
    if kind == 1:
        w[torch.randperm(vocab, generator=g)[: vocab // 2]] = 0.0
    elif kind == 2:
        w = torch.nn.functional.one_hot(torch.randint(0, vocab, (1,), generator=g)[0], vocab).double()
    elif kind == 3:
        w = torch.randint(0, 3, (vocab,), generator=g).double()
    if w.sum() == 0:
        w[0] = 1.0
    return w / w.sum()


class PathLaw:
    """path -> law, memoised; draft laws keep `support` tokens."""

    def __init__(self, seed: int, vocab: int, support: int | None = None) -> None:
        self.seed, self.vocab, self.support = seed, vocab, support
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, path: tuple[int, ...]) -> torch.Tensor:
        if path not in self.memo:
            seed = hash((self.seed, path)) % 2**31
            law = random_law(seed, self.vocab)
            if self.support is not None:
                g = torch.Generator().manual_seed(seed + 1)
                law = torch.zeros(self.vocab, dtype=torch.float64)
                law[torch.randperm(self.vocab, generator=g)[: self.support]] = torch.rand(self.support, generator=g).double() + 0.05
                law /= law.sum()
            self.memo[path] = law
        return self.memo[path]


def random_shape(g: torch.Generator, nodes: int, max_depth: int, chain: bool) -> list[int]:
    if chain:
        return list(range(-1, nodes - 1))
    parents, depth = [-1], [0]
    for i in range(1, nodes):
        choices = [j for j in range(i) if depth[j] < max_depth]
        parent = choices[int(torch.randint(0, len(choices), (1,), generator=g))]
        parents.append(parent)
        depth.append(depth[parent] + 1)
    return parents


def fixed_tree(shape: list[int], g: torch.Generator, vocab: int) -> DraftTree:
    depth = [0]
    for p in shape[1:]:
        depth.append(depth[p] + 1)
    tokens = torch.randint(0, vocab, (len(shape),), generator=g)
    return DraftTree(tokens=tokens, parents=torch.tensor(shape), depth=torch.tensor(depth))


def exact_check(name: str, cases: int) -> float:
    """The largest gap from losslessness over random cases (0.0 up to rounding when lossless)."""
    verifier = VERIFIERS.build(name)
    chain = name == "chain-rs"
    g = torch.Generator().manual_seed(0)
    gap = 0.0
    for case in range(cases):
        vocab = 2 + case % 5
        target = PathLaw(1000 + case, vocab)
        shape = random_shape(g, 2 + case % 7, 3, chain)
        tree = fixed_tree(shape, g, vocab)
        if name == "greedy":
            rows = target_rows(tree, target)
            one_hot = torch.nn.functional.one_hot(rows.argmax(-1), vocab).double()
            gap = max(gap, law_gap(exact_law(verifier, tree, rows), target_law(tree, one_hot)))
            continue
        gap = max(gap, law_gap(exact_law(verifier, tree, target), target_law(tree, target)))
        draft = PathLaw(2000 + case, vocab, support=min(2, vocab))
        small = random_shape(g, 2 + case % 5, 3, chain)
        for replacement in (True, False):
            law = exact_law(verifier, lambda rng: sample_tree(0, draft, small, rng, replacement), target)
            gap = max(gap, next_token_gap(law, target))
    return gap


def chi_square_pvalue(counts: Counter, law: dict, n: int) -> float:
    if any(k not in law for k in counts):
        return 0.0
    cells, pooled = [], [0.0, 0]
    for k, p in law.items():
        if n * p < 5:
            pooled[0] += n * p
            pooled[1] += counts.get(k, 0)
        else:
            cells.append((counts.get(k, 0), n * p))
    if pooled[0] > 0:
        cells.append((pooled[1], pooled[0]))
    if len(cells) < 2:
        return 1.0
    stat = sum((o - e) ** 2 / e for o, e in cells)
    return float(torch.special.gammaincc(torch.tensor((len(cells) - 1) / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def mc_check(name: str, draws: int) -> float:
    """Bonferroni-adjusted min p-value of `verify` against exact_law on a fixed and a sampled case."""
    verifier = VERIFIERS.build(name)
    sampling = SamplingConfig(temperature=0.0 if name == "greedy" else 1.0)
    vocab = 5
    target = PathLaw(7, vocab)
    shape = [-1, 0, 1, 2] if name == "chain-rs" else [-1, 0, 0, 1, 1, 2]
    tree = fixed_tree(shape, torch.Generator().manual_seed(3), vocab)
    draft = PathLaw(8, vocab, support=2)
    fixed_rows = target_rows(tree, target)
    cases: list[tuple[Callable[[TorchRandomness], DraftTree], dict]] = [
        (lambda rng: tree, exact_law(verifier, tree, fixed_rows if name == "greedy" else target))]
    if name != "greedy":
        sampler = lambda rng: sample_tree(0, draft, shape, rng, True)  # noqa: E731
        cases.append((sampler, exact_law(verifier, sampler, target)))
    pvalues = []
    for i, (draw, law) in enumerate(cases):
        rng, draft_rng = TorchRandomness(10 + i), TorchRandomness(20 + i)
        counts: Counter = Counter()
        for _ in range(draws):
            t = draw(draft_rng)
            rows = target_rows(t, target)
            logits = rows if name == "greedy" else rows.log()
            counts[tuple(verifier.verify(t, logits, sampling, rng).tokens)] += 1
        pvalues.append(chi_square_pvalue(counts, law, draws))
    return min(1.0, min(pvalues) * len(pvalues))


def gsm8k_tau(name: str, target, questions: list[str], new_tokens: int) -> dict:  # type: ignore[no-untyped-def]
    from specbench.engine import SpecDecoder

    lossless = VERIFIERS.get(name).lossless
    decoder = SpecDecoder(target, SpecConfig(drafter="self", verifier=name, budget=8, allow_lossy=not lossless),
                          max_seq_len=2048)
    rounds = accepted = tokens = 0
    t0 = time.perf_counter()
    for i, question in enumerate(questions):
        res = decoder.generate(target.encode_chat(question), new_tokens, SamplingConfig(temperature=1.0, seed=i))
        rounds += len(res.stats.rounds)
        accepted += sum(r.accepted + 1 for r in res.stats.rounds)
        tokens += res.stats.new_tokens
        print(f"  {name}: question {i + 1}/{len(questions)} tau {res.stats.tau:.2f}", file=sys.stderr, flush=True)
    return {"tau": accepted / rounds, "rounds": rounds, "new_tokens": tokens, "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data", help="folder holding gsm8k_test.jsonl")
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--exact-cases", type=int, default=40)
    ap.add_argument("--mc-draws", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("--verifiers", default="", help="comma-separated subset (default: all registered)")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = Path(args.data) / "gsm8k_test.jsonl"
    if not path.is_file():
        sys.exit(f"verifier_table: {path} not found; pass --data pointing at the shared data folder")
    questions = [json.loads(line)["question"] for line in path.open()][: args.questions]
    names = args.verifiers.split(",") if args.verifiers else VERIFIERS.names()

    from specbench.models import load_target

    target = load_target(device="cpu", dtype="float32")
    rows = []
    for name in names:
        t0 = time.perf_counter()
        gap = exact_check(name, args.exact_cases)
        p = mc_check(name, args.mc_draws)
        print(f"{name}: exact gap {gap:.1e}, MC p {p:.3f} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        tau = None if name == "greedy" else gsm8k_tau(name, target, questions, args.new_tokens)
        rows.append({"verifier": name, "lossless_flag": VERIFIERS.get(name).lossless, "exact_gap": gap,
                     "exact_proven": gap < TOL, "mc_p": p, "gsm8k": tau})
    meta = {"questions": len(questions), "new_tokens": args.new_tokens, "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(), "torch": torch.__version__}
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"\nverifiers on {target.name} (fp32, CPU, {meta['threads']} threads); tau: GSM8K test x{len(questions)}, "
          f"T=1, drafter self, budget 8, {args.new_tokens} new tokens")
    print("| verifier | lossless flag | lossless proven by exact test | MC agreement p | mean tau |")
    print("|---|---|---|---|---|")
    for r in rows:
        proven = "yes" if r["exact_proven"] else f"no (gap {r['exact_gap']:.2g})"
        tau = "n/a (T = 0 only)" if r["gsm8k"] is None else f"{r['gsm8k']['tau']:.3f}"
        print(f"| {r['verifier']} | {r['lossless_flag']} | {proven} | {r['mc_p']:.3f} | {tau} |")


if __name__ == "__main__":
    main()
