"""What CUDA-graph capture needs, checked on the CPU: from the second round on, every stage the GPU
round captures (a device drafter's phases, the verify forward, accept, commit with the drafter's
observe) runs without a host read (`host_reads.no_host_reads`), and the tokens are still AR's. On CUDA (marked
`gpu`), the same configurations captured in graphs against the eager round, on random weights (no model to stage)."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SpecConfig
from specbench.drafters.eagle3.drafter import Eagle3Drafter
from specbench.drafters.heads.backbone import DraftHead, HeadConfig
from specbench.drafters.heads.jetspec_tree import JetSpecTreeDrafter
from specbench.drafters.heads.parallel import DFlashDrafter, JetSpecDrafter
from specbench.drafters.jetspecpp.adapter import AdapterConfig, StateAdapter
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.drafters.ngram import NgramDrafter
from specbench.engine import SpecDecoder
from specbench.models import load_target
from specbench.models.graphs import Constant, SideStage, StageGraphs

from graph_checks import check_graphed_equals_eager
from host_reads import HostRead, no_host_reads

PROMPTS = [[5, 17, 33, 2, 90, 41], [88, 3, 14, 15, 92, 65, 35, 89, 79]]


@pytest.fixture(scope="module")
def tiny():
    return load_target("random:tiny-llama@3")


def _head_drafter(target, cls, attention: str, clean_next: bool = False):
    cfg = HeadConfig(drafter=cls.name, taps=(0, 1), num_layers=1, block_size=6, attention=attention,
                     clean_next=clean_next)
    return cls(target, head=DraftHead(target.config, cfg).init_weights(target.model, seed=2))


def _jetspecpp(target, states: str):
    """jetspec++ with J=2 refinement passes, both refreshed, anchor replacement, taps (0, 1) (layer 2 is
    the decoder's); the adapter's read-outs perturbed so its predictions vary. STATES "foresight": the
    predicted states with the device round's foresight stage (B = 4) and its lookup in the commit."""
    head = DraftHead(target.config, HeadConfig(drafter="jetspec++", taps=(0, 1), num_layers=1, block_size=6,
                                               attention="block-causal")).init_weights(target.model, seed=2)
    adapter = StateAdapter(target.config, AdapterConfig(taps=(0, 1), layers=(1, 1), block_size=6))
    adapter.init_weights(target.model, seed=2)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for t in (0, 1):
            adapter.tap(t).out.weight.copy_(0.3 * torch.randn(adapter.tap(t).out.weight.shape, generator=g))
    if states == "foresight":
        return JetSpecPPDrafter(target, head=head, adapter=adapter, J=2, R=2, foresight="on", B=4, pipeline="sequential")
    return JetSpecPPDrafter(target, head=head, adapter=adapter, J=2, R=2, states=states)


def _drafter(target, name: str):
    if name == "dflash":
        return _head_drafter(target, DFlashDrafter, "bidirectional")
    if name == "jetspec":
        return _head_drafter(target, JetSpecDrafter, "block-causal")
    if name == "jetspec-tree":
        return _head_drafter(target, JetSpecTreeDrafter, "block-causal", clean_next=True)
    if name == "eagle3":
        return Eagle3Drafter(target, random_init=True, draft_vocab=48, seed=1)
    if name == "ngram":  # device drafting on the CPU too (by default only off it)
        return NgramDrafter(target, on_device=True)
    if name is not None and name.startswith("jetspec++"):  # jetspec++:STATES (default predicted)
        return _jetspecpp(target, name.partition(":")[2] or "predicted")
    return None


CASES = [(None, "chain", 1), ("dflash", "ddtree-vec", 12), ("dflash", "chain", 4), ("jetspec", "eagle2", 8),
         ("jetspec-tree", "ddtree-vec", 8), ("eagle3", "eagle2", 10), ("eagle3", "chain", 4),
         ("jetspec++", "chain", 5), ("jetspec++", "ddtree-vec", 10), ("jetspec++:stale", "chain", 4),
         ("jetspec++:true", "ddtree-vec", 8), ("ngram", "chain", 6), ("ngram", "ddtree-vec", 16),
         ("jetspec++:foresight", "chain", 5), ("jetspec++:foresight", "ddtree-vec", 8)]


@pytest.mark.parametrize("drafter, tree, budget", CASES, ids=[f"{d}/{t}/{b}" for d, t, b in CASES])
def test_captured_stages_read_nothing_back(tiny, drafter, tree, budget) -> None:
    ar = SpecDecoder(tiny, SpecConfig(), max_seq_len=128)
    spec = SpecConfig(drafter=drafter and drafter.partition(":")[0], tree=tree, budget=budget)
    decoder = SpecDecoder(tiny, spec, max_seq_len=128, drafter=_drafter(tiny, drafter), capture_check=no_host_reads)
    assert decoder.device_drafting, "this configuration is meant to be capturable"
    for prompt in PROMPTS:
        assert decoder.generate(prompt, 24).tokens == ar.generate(prompt, 24).tokens


def test_the_checker_catches_a_host_read() -> None:
    x = torch.arange(4)
    with no_host_reads(), pytest.raises(HostRead):
        int(x.sum())
    with no_host_reads(), pytest.raises(HostRead):
        x.tolist()
    with no_host_reads(), pytest.raises(HostRead):
        torch.tensor([1, 2])
    with no_host_reads(), pytest.raises(HostRead):
        x[x > 1]
    with no_host_reads(), pytest.raises(HostRead):
        x[x.argmax()]  # a 0-d index tensor becomes a Python int
    with torch.inference_mode():  # the decode loop's mode, where scalar reads bypass the dispatch mode
        y = torch.arange(4)
        for read in (lambda: int(y.sum()), lambda: y.sum().item(), lambda: bool(y[0] == 0), lambda: float(y.sum())):
            with no_host_reads(), pytest.raises(HostRead):
                read()
    with no_host_reads():
        (x * 2).sum()  # device work is fine
        x[x.argmax().view(1)]


@pytest.mark.parametrize("extra", [16, 0], ids=["extra16", "to-the-end"])
@pytest.mark.parametrize("drafter, tree, budget", [c for c in CASES if c[0] is not None],
                         ids=[f"{d}/{t}/{b}" for d, t, b in CASES if d is not None])
def test_replay_rounds_read_nothing_back_and_match_the_host_walk(tiny, drafter, tree, budget, extra) -> None:
    """Exact replay as the device round (its stages checked for host reads from the second round on; the
    default on CUDA) gives the host walk's rounds and AR's tokens; with no tokens past the reference's end
    (extra 0) the last walks reach it and drop their bonus as the host walk does."""
    from specbench.bench.replay import build_references, replay
    from specbench.trees import TREE_POLICIES

    name = drafter.partition(":")[0]
    policy = TREE_POLICIES.build(tree)
    spec = SpecConfig(drafter=name, tree=tree, budget=budget)
    on_device = SpecDecoder(tiny, spec, max_seq_len=128, drafter=_drafter(tiny, drafter), policy=policy,
                            capture_check=no_host_reads, replay_on_device=True)
    on_host = SpecDecoder(tiny, spec, max_seq_len=128, drafter=_drafter(tiny, drafter), policy=policy,
                          replay_on_device=False)
    assert on_device.replay_on_device and not on_host.replay_on_device
    refs = build_references(tiny, PROMPTS, 24, on_device.drafter.taps, extra=extra, batch_size=1)
    ar = SpecDecoder(tiny, SpecConfig(), max_seq_len=128)
    for prompt, ref in zip(PROMPTS, refs):
        got = replay(on_device.drafter, ref, policy, budget, 24, decoder=on_device)
        want = replay(on_host.drafter, ref, policy, budget, 24, decoder=on_host)
        assert got.accepted == want.accepted and got.output == want.output == ar.generate(prompt, 24).tokens
        assert got.ref_exhausted == want.ref_exhausted
    assert on_device.captured == () or all(k.startswith("replay:") for k in on_device.captured)


@pytest.fixture(scope="module")
def smollm2_shape_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return load_target("random:smollm2-135m-shape@0", device="cuda", dtype="float32")


def test_a_constant_stage_is_not_captured_and_cannot_be_the_side_stage() -> None:
    """AR's draft stage has no device work: a `Constant` returns its value and gets no graph (the GPU
    test below fails on an empty capture); as the side stage it is refused before anything is captured."""
    tree = object()
    assert Constant(tree)(None) is tree
    with pytest.raises(ValueError, match="side stage 'draft' is a Constant"):
        StageGraphs([("draft", Constant(tree)), ("verify", lambda x: x), ("commit", lambda x: x)], None,
                    side=SideStage(name="draft", fork="draft", join="commit", stream=None))  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.filterwarnings("error:The CUDA Graph is empty")  # a stage with no device work captured (AR's draft, before)
@pytest.mark.parametrize("drafter, tree, budget", CASES, ids=[f"{d}/{t}/{b}" for d, t, b in CASES])
def test_cuda_graphs_replay_the_eager_round(smollm2_shape_cuda, drafter, tree, budget) -> None:
    """The same configurations captured in CUDA graphs: the eager round's trees and AR's tokens, twice
    per prompt (the second replays the first's graphs), then with lookahead. Random weights of
    SmolLM2's shapes, so it needs no staged model."""
    target = smollm2_shape_cuda
    spec = SpecConfig(drafter=drafter and drafter.partition(":")[0], tree=tree, budget=budget)
    ar = SpecDecoder(target, SpecConfig(), max_seq_len=128)
    graphed = SpecDecoder(target, spec, max_seq_len=128, drafter=_drafter(target, drafter))
    eager = SpecDecoder(target, spec, max_seq_len=128, drafter=_drafter(target, drafter), cuda_graphs=False)
    assert graphed.device_drafting
    check_graphed_equals_eager(graphed, eager, PROMPTS, [ar.generate(p, 32).tokens for p in PROMPTS], 32)
