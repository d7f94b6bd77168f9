"""The GPU round (CUDA-graph stages, lookahead) against the same stages run eagerly, fp32, on the real
default target with its shipped heads: identical draft trees round by round and identical tokens, and
greedy SD equal to AR. Run on the device: `python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SpecConfig
from specbench.engine import SpecDecoder

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CONFIGS = [
    (None, "chain", 1),
    ("dflash", "ddtree", 64),
    ("dflash", "chain", 16),
    ("jetspec", "ddtree", 64),
    ("jetspec-tree", "ddtree", 32),
    ("eagle3", "eagle2", 32),
    ("eagle3", "chain", 6),
    ("ngram", "ddtree", 16),
    ("self", "chain", 3),
]
PROMPTS = ["Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did she sell altogether?", "Write a Python function that returns the n-th prime."]


@pytest.fixture(scope="module")
def target():
    from specbench.models import load_target

    return load_target(None, device="cuda", dtype="float32")


@pytest.fixture(scope="module")
def ar_tokens(target):
    ar = SpecDecoder(target, SpecConfig(), max_seq_len=768, cuda_graphs=False)
    return [ar.generate(target.encode_chat(p), 96).tokens for p in PROMPTS]


def _trees(decoder: SpecDecoder, ids: list[int], new: int) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    seen: list[tuple[list[int], list[int]]] = []
    result = decoder.generate(ids, new, on_round=lambda n, tree, res: seen.append((tree.tokens.tolist(), tree.parents.tolist())))
    return result.tokens, seen


@pytest.mark.parametrize("drafter, tree, budget", CONFIGS, ids=[f"{d}/{t}/{b}" for d, t, b in CONFIGS])
def test_graphed_round_equals_eager_and_ar(target, ar_tokens, drafter, tree, budget) -> None:
    spec = SpecConfig(drafter=drafter, tree=tree, budget=budget)
    graphed = SpecDecoder(target, spec, max_seq_len=768)
    eager = SpecDecoder(target, spec, max_seq_len=768, cuda_graphs=False)
    assert graphed.cuda_graphs and not eager.cuda_graphs
    for text, want in zip(PROMPTS, ar_tokens):
        ids = target.encode_chat(text)
        for _ in range(2):  # the second request replays graphs captured in the first
            g_tokens, g_trees = _trees(graphed, ids, 96)
            e_tokens, e_trees = _trees(eager, ids, 96)
            assert g_trees == e_trees, "the graphed round drafted other trees than the eager one"
            assert g_tokens == e_tokens == want, "diverged from AR greedy"
        assert graphed.generate(ids, 96).tokens == want  # with lookahead (no on_round hook)
    assert graphed._graphs is not None, "the round was never captured"
