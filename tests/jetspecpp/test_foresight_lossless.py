"""jetspec++ with foresight at T > 0, exactly: the whole SpecDecoder (foresight drafting ahead into the
speculation cache, blocks served on hits, critical-path drafts on misses) on a float64 target over 5
tokens, every random draw enumerated (drafting and verification share one enumerator), emits the
first tokens with exactly the law of ancestral sampling, under every verifier the drafter supports
(and with the context n-gram expert in the outcome scores);
and the enumeration covers rounds served from the cache and rounds drafted on the critical path."""

from __future__ import annotations

import pytest

from specbench.config import SamplingConfig, SpecConfig
from specbench.drafters.jetspecpp.calibration import RowTemperature
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.engine import SpecDecoder
from specbench.verify import enumerate_law, law_gap

from jetspecpp_helpers import random_parts, tiny_exact_target
from test_jetspecpp_lossless import BLOCK, NEW_TOKENS, PROMPT, target_law

CASES = [  # verifier, top_k, tree, budget, J, R, states, B, selection args (B small enough for misses)
    ("sample-walk", 0, "chain", 2, 1, 1, "predicted", 1, {}),
    ("sample-walk", 2, "ddtree", 2, 1, 1, "predicted", 1, {}),
    ("sample-walk", 2, "chain", 2, 1, 1, "predicted", 1, {"select": "ssd"}),
    ("chain-rs", 2, "chain", 2, 1, 1, "predicted", 1, {}),
    ("chain-rs", 2, "chain", 2, 2, 1, "true", 3, {"scores": "draft"}),
    ("tree-rrs", 2, "chain", 2, 1, 1, "stale", 1, {"select": "threshold", "lam": 0.05}),
    ("traversal", 2, "chain", 2, 1, 0, "predicted", 1, {}),
    # the context n-gram expert: outcome scores read the committed tokens, never the verify result
    ("sample-walk", 0, "chain", 2, 1, 1, "predicted", 1, {"calibration": RowTemperature((1.0,), (1.5, 3.0, 1.0))}),
]


@pytest.mark.parametrize("verifier,top_k,tree,budget,J,R,states,B,args", CASES)
def test_law_of_first_tokens_with_foresight_is_ar_law(verifier, top_k, tree, budget, J, R, states, B, args) -> None:  # type: ignore[no-untyped-def]
    target = tiny_exact_target()
    sampling = SamplingConfig(temperature=1.0, top_k=top_k)
    head, adapter = random_parts(target, taps=(0,), block_size=BLOCK, seed=4)
    drafter = JetSpecPPDrafter(target, head=head, adapter=adapter, J=J, R=R, states=states, foresight="on", B=B, **args)
    decoder = SpecDecoder(target, SpecConfig(drafter="jetspec++", tree=tree, verifier=verifier, budget=budget),
                          drafter=drafter, max_seq_len=32)

    def run(rng) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
        return tuple(decoder.generate(PROMPT, NEW_TOKENS, sampling, rng=rng, draft_rng=rng).tokens)

    law = enumerate_law(run)
    assert law_gap(law, target_law(sampling)) < 1e-12
    served = [e["hit"] for e in drafter.foresight.log if e["hit"] is not None]
    assert any(served) and not all(served), "the enumeration should reach both cache hits and misses"
