"""Exact replay on CUDA as the graphed device round (the default there) against the host walk of the same
references, fp32, on the real default target with its shipped heads: the same accepted count in every
round and AR's tokens, and the replay's stages captured. Run on the device: `python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from specbench.bench.replay import build_references, replay
from specbench.config import SpecConfig
from specbench.engine import SpecDecoder
from specbench.trees import TREE_POLICIES

from cuda_cases import MAX_SEQ_LEN, NEW, PROMPTS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CONFIGS = [("dflash", "ddtree", 64), ("jetspec", "chain", 16), ("jetspec-tree", "ddtree", 32), ("eagle3", "eagle2", 32),
           ("ngram", "ddtree", 16), ("jetspec++", "chain", 16), ("jetspec++", "ddtree", 64)]


@pytest.mark.parametrize("drafter, tree, budget", CONFIGS, ids=[f"{d}/{t}/{b}" for d, t, b in CONFIGS])
def test_graphed_replay_equals_the_host_walk(target, ar_tokens, drafter, tree, budget) -> None:
    spec = SpecConfig(drafter=drafter, tree=tree, budget=budget)
    policy = TREE_POLICIES.build(tree)
    graphed = SpecDecoder(target, spec, max_seq_len=MAX_SEQ_LEN, policy=policy)
    walked = SpecDecoder(target, spec, max_seq_len=MAX_SEQ_LEN, policy=policy, replay_on_device=False)
    assert graphed.replay_on_device and graphed.cuda_graphs
    prompts = [target.encode_chat(p) for p in PROMPTS]
    refs = build_references(target, prompts, NEW, graphed.drafter.taps)
    for ref, want in zip(refs, ar_tokens):
        got = replay(graphed.drafter, ref, policy, budget, NEW, decoder=graphed)
        host = replay(walked.drafter, ref, policy, budget, NEW, decoder=walked)
        assert got.output == host.output == want
        assert got.accepted == host.accepted, f"{drafter}/{tree}/{budget}: graphed {got.accepted} vs host {host.accepted}"
    assert any(k.startswith("replay:") for k in graphed.captured)
