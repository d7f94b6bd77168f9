"""jetspec++'s foresight in the device round on CUDA, fp32, the real default target: the foresight stage
replayed from its CUDA graph on a second stream beside the verify forward (the other stages graphed on
the main stream, each branch captured once) drafts round by round the same trees, with the same hit
flags, as the same stages run eagerly (inline), and both emit the AR greedy tokens, as does the host
round's foresight (host=true). (The host round's hits are not compared here: it reads the filled cache
slots where the device round reads whole caches, so fp32 GPU kernels may break near-ties differently;
the CPU test holds the two rounds to the same hits and trees.)

The draft head is the shipped jetspec head with an untrained adapter (`test_jetspecpp_device_cuda.parts`;
hits are then rare), or SPECBENCH_JETSPECPP_HEAD=DIR, a trained jetspec++ checkpoint (hits are then
required). Run on the device: `python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SpecConfig
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.engine import SpecDecoder

from cuda_cases import MAX_SEQ_LEN, NEW, PROMPTS, trees
from test_jetspecpp_device_cuda import TRAINED, parts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CASES = [(1, 1, 16, "chain", 15), (2, 1, 8, "ddtree-vec", 24)]


def decode(target, decoder: SpecDecoder):  # type: ignore[no-untyped-def]
    """Per prompt, twice (the second replays what the first captured): (tokens, trees, hit flags)."""
    out = []
    for text in PROMPTS:
        for _ in range(2):
            decoder.drafter.foresight.clear_log()  # type: ignore[union-attr]
            tokens, seen = trees(decoder, target.encode_chat(text))
            out.append((tokens, seen, [e["hit"] for e in decoder.drafter.foresight.log]))  # type: ignore[union-attr]
    return out


@pytest.mark.parametrize("trained", [False] + ([True] if TRAINED else []), ids=lambda t: "trained" if t else "jetspec-head")
@pytest.mark.parametrize("J,R,B,tree,budget", CASES, ids=[f"J{c[0]}R{c[1]}B{c[2]}-{c[3]}" for c in CASES])
def test_graphed_foresight_on_a_second_stream_equals_eager_and_ar(target, ar_tokens, trained, J, R, B, tree, budget) -> None:
    head, adapter = parts(target, trained)
    spec = SpecConfig(drafter="jetspec++", tree=tree, budget=budget)
    make = lambda **kw: JetSpecPPDrafter(target, head=head, adapter=adapter, J=J, R=R, foresight="on", B=B, **kw)  # noqa: E731
    graphed = SpecDecoder(target, spec, max_seq_len=MAX_SEQ_LEN, drafter=make(pipeline="concurrent"))
    eager = SpecDecoder(target, spec, max_seq_len=MAX_SEQ_LEN, drafter=make(), cuda_graphs=False)
    host = SpecDecoder(target, spec, max_seq_len=MAX_SEQ_LEN, drafter=make(host=True, pipeline="sequential"))
    assert graphed.branching and not graphed.lookahead and not host.branching
    g, e, h = decode(target, graphed), decode(target, eager), decode(target, host)
    want = [w for w in ar_tokens for _ in range(2)]
    assert [r[0] for r in g] == [r[0] for r in e] == [r[0] for r in h] == want, "diverged from AR greedy"
    assert [r[1] for r in g] == [r[1] for r in e], "the graphed round drafted other trees than the eager one"
    assert [r[2] for r in g] == [r[2] for r in e], "other hits than the eager round's"
    assert "miss" in graphed.captured and graphed._graphs["miss"].side is not None, "the foresight stage has no side stream"
    flags = [f for r in g for f in r[2]]
    if trained:
        assert any(flags) and "hit" in graphed.captured, "no block was served from a captured hit round"
    res = graphed.generate(target.encode_chat(PROMPTS[0]), NEW)
    sides = [r.side_time for r in res.stats.rounds if r.side_time is not None]
    assert sides and all(t > 0 for t in sides), "the side stream's own span was not recorded"
