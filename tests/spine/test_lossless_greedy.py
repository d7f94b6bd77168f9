"""Greedy speculative decoding must emit exactly the AR greedy tokens (fp32, real SmolLM2 target)."""

from __future__ import annotations

import pytest

from specbench.config import SpecConfig
from specbench.engine import SpecDecoder

PROMPTS = {
    "math": "A farmer has 17 sheep and buys 3 times as many goats. How many animals does he have? Show your steps.",
    "code": "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "chat": "What are three tips for sleeping better?",
    "summary": "Summarize in two sentences: The library opened a new wing with study rooms and a cafe.",
    "list": "List the planets of the solar system in order, one per line.",
    "json": 'Return a JSON object with keys "name" and "age" for a person called Ada who is 36.',
}
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def ar_outputs(smollm2):
    decoder = SpecDecoder(smollm2, SpecConfig(drafter=None), max_seq_len=256)
    return {k: decoder.generate(smollm2.encode_chat(p), NEW_TOKENS).tokens for k, p in PROMPTS.items()}


@pytest.mark.parametrize("budget", [1, 4, 16])
@pytest.mark.parametrize("drafter, args", [("ngram", {}), ("self", {"layers": 4})])
def test_greedy_sd_equals_ar(smollm2, ar_outputs, drafter: str, args: dict, budget: int) -> None:
    decoder = SpecDecoder(smollm2, SpecConfig(drafter=drafter, budget=budget, drafter_args=args), max_seq_len=256)
    accepted = 0
    for key, prompt in PROMPTS.items():
        result = decoder.generate(smollm2.encode_chat(prompt), NEW_TOKENS)
        assert result.tokens == ar_outputs[key], f"{drafter} budget {budget} diverged from AR on the {key} prompt"
        assert len(result.tokens) == NEW_TOKENS or result.tokens[-1] in smollm2.eos_token_ids
        accepted += sum(r.accepted for r in result.stats.rounds)
    assert accepted > 0, "no draft token was ever accepted: the test would not exercise commit paths"


@pytest.mark.slow
@pytest.mark.parametrize("tree, args", [("eagle2", {"top_k": 3, "max_depth": 4}), ("static", {"tree": "default-31"})])
def test_greedy_self_tree_drafting_equals_ar(smollm2, ar_outputs, tree: str, args: dict) -> None:
    decoder = SpecDecoder(smollm2, SpecConfig(drafter="self", tree=tree, budget=12, tree_args=args,
                                              drafter_args={"layers": 4}), max_seq_len=256)
    for key in ("math", "code"):
        result = decoder.generate(smollm2.encode_chat(PROMPTS[key]), NEW_TOKENS)
        assert result.tokens == ar_outputs[key]
        assert max(r.tree_size for r in result.stats.rounds) > 4  # really a tree, not a chain
