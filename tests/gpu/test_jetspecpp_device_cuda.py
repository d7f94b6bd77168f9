"""jetspec++'s device round on CUDA, fp32, the real default target: the round's stages replayed from
CUDA graphs (with lookahead) draft round by round the same trees as the same stages run eagerly, and
both emit the AR greedy tokens, for every state source and the capturable tree policies.

The draft head is the shipped jetspec head (refined by J passes) with an untrained adapter of its taps
(read-outs perturbed: refreshes move tokens); SPECBENCH_JETSPECPP_HEAD=DIR (a trained jetspec++ checkpoint, e.g.
the shipped specbench/heads/jetspec++-smollm2-135m) adds its cases. Run on the
device: `python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import os

import pytest
import torch

from specbench.config import SpecConfig
from specbench.drafters.jetspecpp.adapter import AdapterConfig, StateAdapter
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.drafters.jetspecpp.model import load_jetspecpp
from specbench.engine import SpecDecoder

from cuda_cases import MAX_SEQ_LEN, check_graphed_equals_eager

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

JETSPEC_HEAD = "specbench/heads/jetspec-smollm2-135m"
TRAINED = os.environ.get("SPECBENCH_JETSPECPP_HEAD")
CASES = [("predicted", 2, 2, True, "chain", 15), ("predicted", 1, 1, False, "ddtree", 32),
         ("predicted", 3, 1, True, "ddtree-vec", 24), ("stale", 2, 1, True, "ddtree", 32), ("true", 1, 1, True, "chain", 15)]


def parts(target, trained: bool):  # type: ignore[no-untyped-def]
    """(draft head, adapter): the trained jetspec++ checkpoint's, or the jetspec head's with an
    untrained adapter of its taps."""
    if trained:
        return load_jetspecpp(target, TRAINED)
    head, _ = load_jetspecpp(target, JETSPEC_HEAD)
    taps = head.config.taps
    adapter = StateAdapter(target.config, AdapterConfig(taps=taps, layers=(1,) * len(taps), block_size=head.config.block_size))
    adapter = adapter.to(target.device).init_weights(target.model, seed=3)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for t in taps:
            out = adapter.tap(t).out
            out.weight.copy_(0.02 * torch.randn(out.weight.shape, generator=g).to(out.weight.device))
    return head, adapter


@pytest.mark.parametrize("trained", [False] + ([True] if TRAINED else []), ids=lambda t: "trained" if t else "jetspec-head")
@pytest.mark.parametrize("states,J,R,replace,tree,budget", CASES, ids=[f"{c[0]}-J{c[1]}R{c[2]}{'' if c[3] else '-norep'}-{c[4]}"
                                                                     for c in CASES])
def test_graphed_device_round_equals_eager_and_ar(target, ar_tokens, trained, states, J, R, replace, tree, budget) -> None:
    head, adapter = parts(target, trained)
    spec = SpecConfig(drafter="jetspec++", tree=tree, budget=budget)
    make = lambda: JetSpecPPDrafter(target, head=head, adapter=adapter, J=J, R=R, replace=replace, states=states)  # noqa: E731
    graphed = SpecDecoder(target, spec, max_seq_len=MAX_SEQ_LEN, drafter=make())
    eager = SpecDecoder(target, spec, max_seq_len=MAX_SEQ_LEN, drafter=make(), cuda_graphs=False)
    assert graphed.device_drafting and graphed.lookahead
    check_graphed_equals_eager(target, graphed, eager, ar_tokens)
