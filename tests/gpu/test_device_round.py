"""The GPU round (CUDA-graph stages, lookahead) against the same stages run eagerly, fp32, on the real
default target with its shipped heads: identical draft trees round by round and identical tokens, and
greedy SD equal to AR. Run on the device: `python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SpecConfig
from specbench.engine import SpecDecoder

from cuda_cases import MAX_SEQ_LEN, check_graphed_equals_eager

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
    ("ngram", "ddtree", 64),
    ("ngram", "chain", 16),
    ("self", "chain", 3),
]


@pytest.mark.parametrize("drafter, tree, budget", CONFIGS, ids=[f"{d}/{t}/{b}" for d, t, b in CONFIGS])
def test_graphed_round_equals_eager_and_ar(target, ar_tokens, drafter, tree, budget) -> None:
    spec = SpecConfig(drafter=drafter, tree=tree, budget=budget)
    graphed = SpecDecoder(target, spec, max_seq_len=MAX_SEQ_LEN)
    eager = SpecDecoder(target, spec, max_seq_len=MAX_SEQ_LEN, cuda_graphs=False)
    if drafter == "ngram":
        assert graphed.device_drafting and graphed.lookahead, "ngram drafts on the device there (captured, lookahead)"
    check_graphed_equals_eager(target, graphed, eager, ar_tokens)
