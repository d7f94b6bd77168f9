"""jetspec++ with foresight on CUDA, fp32, the real default target and the shipped jetspec head (no
jetspec++ head ships: the stale / true state sources): the pass on a second stream (concurrent), with
the verify forward replayed from CUDA graphs, drafts round by round the same trees as the pass run
inline (sequential), emits the AR greedy tokens, and serves blocks from the cache; the same with the
draft model on a second GPU when there is one, and on the two-device path with both devices cuda:0
(`draft_copy`: its own weights and transfers, issue 17's path on one GPU). Run on the device: `python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SpecConfig
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.engine import SpecDecoder

from cuda_cases import MAX_SEQ_LEN, NEW, PROMPTS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

HEAD = "specbench/heads/jetspec-smollm2-135m"


def run(target, pipeline: str, draft_device: str | None, states: str, tree: str, budget: int):  # type: ignore[no-untyped-def]
    copy = draft_device == "copy"  # the two-device path with both devices cuda:0 (its own weights, transfers)
    drafter = JetSpecPPDrafter(target, checkpoint=HEAD, J=1, R=1, states=states, foresight="on", B=16,
                               pipeline=pipeline, draft_device="cuda:0" if copy else draft_device, draft_copy=copy)
    decoder = SpecDecoder(target, SpecConfig(drafter="jetspec++", tree=tree, budget=budget), max_seq_len=MAX_SEQ_LEN,
                          drafter=drafter)
    tokens, trees = [], []
    for text in PROMPTS:
        seen: list = []
        res = decoder.generate(target.encode_chat(text), NEW,
                               on_round=lambda n, t, r: seen.append((t.tokens.tolist(), t.parents.tolist())))
        tokens.append(res.tokens)
        trees.append(seen)
    return tokens, trees, [e["hit"] for e in drafter.foresight.log if e["hit"] is not None]


DEVICES = [None, "copy"] + (["cuda:1"] if torch.cuda.device_count() > 1 else [])


@pytest.mark.parametrize("draft_device", DEVICES, ids=[{None: "same-gpu", "copy": "two-device-path-on-cuda0"}.get(d, d)
                                                       for d in DEVICES])
@pytest.mark.parametrize("states,tree,budget", [("true", "chain", 15), ("stale", "ddtree", 32)])
def test_concurrent_foresight_equals_sequential_and_ar(target, ar_tokens, draft_device, states, tree, budget) -> None:
    conc_tokens, conc_trees, conc_hits = run(target, "concurrent", draft_device, states, tree, budget)
    seq_tokens, seq_trees, seq_hits = run(target, "sequential", draft_device, states, tree, budget)
    assert conc_tokens == ar_tokens and seq_tokens == ar_tokens
    assert conc_trees == seq_trees and conc_hits == seq_hits
    if states == "true":
        assert any(conc_hits)
