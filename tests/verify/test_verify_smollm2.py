"""End to end on the real model: SmolLM2-135M (fp32, CPU) at T = 1, top-p 0.9. The first round's
first emitted token, jointly with the prefill token before it, must follow the target's processed
law, under every registered lossless sampling verifier x every training-free drafter (chain policy). Seeded chi-square with a
Bonferroni correction over the combinations: deterministic. Slow (hundreds of full generate calls)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from components import serves_sampling, verifiers
from verify_cases import chi_square_pvalue

from specbench.config import SamplingConfig, SpecConfig
from specbench.drafters import DRAFTERS
from specbench.engine import SpecDecoder
from specbench.verify.sampling import process_logits

PROMPT = "x = 1; y = 2; x = 1; y ="  # the prefill token has 2 choices; ngram finds the repeated context
SAMPLING = SamplingConfig(temperature=1.0, top_p=0.9)
VERIFIERS_T1 = [n for n in verifiers(lossless=True) if serves_sampling(n)]
TRAINING_FREE = [n for n in DRAFTERS.names() if DRAFTERS.get(n).weights is None]
DRAWS = 200
FAMILY_ALPHA = 1e-3


def next_law(target, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    out = target.forward(torch.tensor([ids]), torch.arange(len(ids))[None], target.new_cache(len(ids) + 1),
                         logits_rows="last")
    return process_logits(out.logits[0, -1], SAMPLING)


def two_token_law(target, ids: list[int]) -> dict:  # type: ignore[no-untyped-def]
    first = next_law(target, ids)
    law = {}
    for t0 in first.nonzero().flatten().tolist():
        second = next_law(target, ids + [t0])
        for t1 in second.nonzero().flatten().tolist():
            law[(t0, t1)] = float(first[t0]) * float(second[t1])
    return law


@pytest.mark.slow
def test_first_round_token_follows_target_law(smollm2) -> None:
    ids = smollm2.encode(PROMPT)
    law = two_token_law(smollm2, ids)
    pvalues = {}
    combos = [(drafter, name) for drafter in TRAINING_FREE for name in VERIFIERS_T1]
    for k, (drafter, name) in enumerate(combos):  # disjoint seeds: independent p-values
        decoder = SpecDecoder(smollm2, SpecConfig(drafter=drafter, verifier=name, budget=4), max_seq_len=64)
        drafted = []
        counts: Counter = Counter()
        for seed in range(k * DRAWS, (k + 1) * DRAWS):
            res = decoder.generate(ids, 2, SamplingConfig(temperature=1.0, top_p=0.9, seed=seed),
                                   on_round=lambda i, tree, r: drafted.append(tree.budget))
            counts[tuple(res.tokens)] += 1
        assert sum(b > 0 for b in drafted) > DRAWS // 2  # the first round does verify drafts
        pvalues[(drafter, name)] = chi_square_pvalue(counts, law, DRAWS)
    print("chi-square p-values (first two tokens):", {f"{d}/{v}": round(p, 4) for (d, v), p in pvalues.items()})
    worst = min(pvalues, key=pvalues.get)
    assert pvalues[worst] > FAMILY_ALPHA / len(pvalues), f"{worst}: p = {pvalues[worst]:.2e} ({pvalues})"
