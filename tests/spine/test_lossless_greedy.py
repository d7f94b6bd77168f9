"""Greedy speculative decoding must emit exactly the AR greedy tokens (fp32), for every registered
drafter under each tree policy it works with (`components.drafter_cases`).

On a tiny random target every (drafter, policy) pair runs at budgets 1, 6 and 16, drafters that need
weights with an untrained instance (`random_init=True`: exactness does not depend on the weights). On
the real SmolLM2 target every drafter runs with its default weights (the shipped head, or none) under
`chain`, and drafts must get accepted: budget 4 on two prompts (48 tokens) by default, budgets 1, 4
and 16 on six prompts (64 tokens) in the slow run.
"""

from __future__ import annotations

import pytest
from components import drafter_cases
from targets import tiny_target

from specbench.config import SpecConfig
from specbench.drafters import DRAFTERS
from specbench.engine import SpecDecoder

pytestmark = pytest.mark.usefixtures("single_thread")  # small batches: a second thread only adds barriers

TINY_PROMPTS = [[5, 17, 33, 2, 90, 41, 5, 17, 33], [88, 3, 14, 15, 92, 65, 35, 89, 79, 3, 14]]
TINY_NEW = 24
CASES = drafter_cases()


@pytest.fixture(scope="module")
def tiny():
    return tiny_target(num_layers=4, seed=3)


@pytest.fixture(scope="module")
def tiny_ar(tiny):
    decoder = SpecDecoder(tiny, SpecConfig(drafter=None), max_seq_len=128)
    return [decoder.generate(p, TINY_NEW).tokens for p in TINY_PROMPTS]


def untrained_args(drafter: str) -> dict:
    return {"random_init": True} if DRAFTERS.get(drafter).weights is not None else {}


@pytest.mark.parametrize("budget", [1, 6, 16])
@pytest.mark.parametrize("drafter,tree,tree_args", CASES, ids=[f"{d}-{t}{a or ''}" for d, t, a in CASES])
def test_greedy_sd_equals_ar_under_every_policy(tiny, tiny_ar, drafter: str, tree: str, tree_args: dict,
                                                budget: int) -> None:
    spec = SpecConfig(drafter=drafter, tree=tree, tree_args=tree_args, budget=budget,
                      drafter_args=untrained_args(drafter))
    decoder = SpecDecoder(tiny, spec, max_seq_len=128)
    for prompt, want in zip(TINY_PROMPTS, tiny_ar):
        assert decoder.generate(prompt, TINY_NEW).tokens == want, f"{drafter}/{tree} diverged from AR greedy"


PROMPTS = {
    "math": "A farmer has 17 sheep and buys 3 times as many goats. How many animals does he have? Show your steps.",
    "code": "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "chat": "What are three tips for sleeping better?",
    "summary": "Summarize in two sentences: The library opened a new wing with study rooms and a cafe.",
    "list": "List the planets of the solar system in order, one per line.",
    "json": 'Return a JSON object with keys "name" and "age" for a person called Ada who is 36.',
}
NEW_TOKENS = 64
FAST_PROMPTS, FAST_TOKENS = ("math", "code"), 48  # the default run's share of the real-target check


@pytest.fixture(scope="module")
def ar_outputs(smollm2):
    """AR greedy tokens per (prompt key, new tokens), computed on first use."""
    decoder = SpecDecoder(smollm2, SpecConfig(drafter=None), max_seq_len=256)
    cache: dict[tuple[str, int], list[int]] = {}

    def get(key: str, new_tokens: int = NEW_TOKENS) -> list[int]:
        if (key, new_tokens) not in cache:
            cache[key, new_tokens] = decoder.generate(smollm2.encode_chat(PROMPTS[key]), new_tokens).tokens
        return cache[key, new_tokens]

    return get


@pytest.mark.parametrize("budget, full", [pytest.param(4, False, id="b4"),
                                          *[pytest.param(b, True, marks=pytest.mark.slow, id=f"b{b}-full") for b in (1, 4, 16)]])
@pytest.mark.parametrize("drafter", DRAFTERS.names())
def test_greedy_sd_equals_ar_on_smollm2(smollm2, ar_outputs, drafter: str, budget: int, full: bool) -> None:
    weights = DRAFTERS.get(drafter).weights
    if weights is not None and not weights.shipped_dir(drafter, smollm2.name).is_dir():
        pytest.skip(f"no {drafter} head ships for {smollm2.name} (train one: {weights.train_command(drafter)})")
    decoder = SpecDecoder(smollm2, SpecConfig(drafter=drafter, budget=budget), max_seq_len=256)
    keys, new_tokens = (list(PROMPTS), NEW_TOKENS) if full else (FAST_PROMPTS, FAST_TOKENS)
    accepted = 0
    for key in keys:
        result = decoder.generate(smollm2.encode_chat(PROMPTS[key]), new_tokens)
        assert result.tokens == ar_outputs(key, new_tokens), f"{drafter} budget {budget} diverged from AR on {key!r}"
        assert len(result.tokens) == new_tokens or result.tokens[-1] in smollm2.eos_token_ids
        accepted += sum(r.accepted for r in result.stats.rounds)
    assert accepted > 0, "no draft token was ever accepted: the test would not exercise commit paths"


@pytest.mark.slow
@pytest.mark.parametrize("tree, args", [("eagle2", {"top_k": 3, "max_depth": 4}), ("static", {"tree": "default-31"})])
def test_greedy_self_tree_drafting_equals_ar(smollm2, ar_outputs, tree: str, args: dict) -> None:
    decoder = SpecDecoder(smollm2, SpecConfig(drafter="self", tree=tree, budget=12, tree_args=args,
                                              drafter_args={"layers": 4}), max_seq_len=256)
    for key in ("math", "code"):
        result = decoder.generate(smollm2.encode_chat(PROMPTS[key]), NEW_TOKENS)
        assert result.tokens == ar_outputs(key)
        assert max(r.tree_size for r in result.stats.rounds) > 4  # really a tree, not a chain
