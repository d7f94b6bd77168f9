"""Fixtures of the GPU tests: the real default target on CUDA in fp32, and AR's greedy tokens of
`cuda_cases.PROMPTS` (the reference every graphed round is held to)."""

from __future__ import annotations

import pytest

from cuda_cases import MAX_SEQ_LEN, NEW, PROMPTS


@pytest.fixture(scope="session")
def target():
    from specbench.models import load_target

    return load_target(None, device="cuda", dtype="float32")


@pytest.fixture(scope="session")
def ar_tokens(target):
    from specbench.config import SpecConfig
    from specbench.engine import SpecDecoder

    ar = SpecDecoder(target, SpecConfig(), max_seq_len=MAX_SEQ_LEN, cuda_graphs=False)
    return [ar.generate(target.encode_chat(p), NEW).tokens for p in PROMPTS]
