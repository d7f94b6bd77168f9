"""jetspec++'s foresight in the device round (`device_foresight.py`, fp32, the pipeline run sequentially on
the CPU): greedy SD emits exactly AR's tokens at several (J, R, B) under chain and ddtree-vec; the device
round serves the same hits and verifies the same trees, round by round, as the host round's foresight
(same selection, same cached blocks), with no host read in any captured stage; and the device lookup
never serves a block drafted for an outcome other than the verified one (a property test, which also
holds the batched ancestor masks of the candidate trees to the paths)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specbench.config import SpecConfig
from specbench.drafters.jetspecpp.cache import Outcome
from specbench.drafters.jetspecpp.calibration import RowTemperature
from specbench.drafters.jetspecpp.device_foresight import match, outcome_keys, verified_key
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.engine import SpecDecoder
from specbench.trees.base import DraftTree, ancestor_masks

from host_reads import no_host_reads
from jetspecpp_helpers import NEW, PROMPTS

SETTINGS = [(0, 0, 4), (1, 1, 16), (2, 1, 1), (2, 2, 8)]  # (J, R, B)


def run(tiny, drafter: JetSpecPPDrafter, tree: str, budget: int, check=None):  # type: ignore[no-untyped-def]
    """Per prompt: (tokens, [tree tokens + parents per round], [hit flag per round])."""
    decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree=tree, budget=budget), max_seq_len=160,
                          drafter=drafter, capture_check=check)
    assert decoder.branching is (check is not None)
    out = []
    for prompt in PROMPTS:
        drafter.foresight.clear_log()
        seen: list[list[int]] = []
        res = decoder.generate(prompt, NEW, on_round=lambda i, t, r: seen.append(t.tokens.tolist() + t.parents.tolist()))
        out.append((res.tokens, seen, [e["hit"] for e in drafter.foresight.log]))
    return out


@pytest.mark.parametrize("J,R,B", SETTINGS)
def test_device_foresight_round_equals_the_host_round_and_ar(tiny, trained_jpp, ar_tokens, J: int, R: int, B: int) -> None:
    obj, _ = trained_jpp
    make = lambda **kw: JetSpecPPDrafter(tiny, head=obj.draft, adapter=obj.adapter, J=J, R=R, foresight="on", B=B,  # noqa: E731
                                         calibration=RowTemperature((16.0,)), pipeline="sequential", **kw)
    for tree, budget in (("chain", 5), ("ddtree-vec", 8)):
        device = run(tiny, make(), tree, budget, check=no_host_reads)
        host = run(tiny, make(host=True), tree, budget)
        for (d_tokens, d_trees, d_hits), (h_tokens, h_trees, h_hits), want in zip(device, host, ar_tokens):
            assert d_tokens == h_tokens == want, f"J{J} R{R} B{B} {tree}: diverged from AR greedy"
            assert d_hits == h_hits, f"J{J} R{R} B{B} {tree}: other hits than the host round's foresight"
            assert d_trees == h_trees, f"J{J} R{R} B{B} {tree}: other trees than the host round's foresight"
        flags = [f for _, _, hits in device for f in hits]

        assert flags[0] is None and None not in flags[1: len(device[0][2])]
        if B > 1:
            assert any(flags), f"J{J} R{R} B{B} {tree}: no block was ever served (the hit branch was not exercised)"


def test_sampled_requests_and_other_policies_take_the_host_rounds_foresight(tiny, trained_jpp) -> None:
    from specbench.config import SamplingConfig
    from specbench.trees import TREE_POLICIES

    obj, _ = trained_jpp
    drafter = JetSpecPPDrafter(tiny, head=obj.draft, adapter=obj.adapter, foresight="on", B=4)
    assert drafter.branches and drafter.capturable(TREE_POLICIES.build("chain"))
    decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree="chain", budget=4, verifier="sample-walk"),
                          max_seq_len=160, drafter=drafter)
    decoder.generate(PROMPTS[0], 16, SamplingConfig(temperature=1.0))  # T > 0: the host round, per request
    assert not drafter.serving and drafter.foresees and not drafter.on_device
    assert decoder.generate(PROMPTS[0], 16).tokens  # then a greedy request: the device round again
    assert drafter.serving and not drafter.foresees and drafter.on_device
    for kw in ({"host": True}, {"record": True}, {"scores": "draft"}, {"states": "stale"}):  # the host round's
        assert not JetSpecPPDrafter(tiny, head=obj.draft, adapter=obj.adapter, foresight="on", **kw).branches
    other = JetSpecPPDrafter(tiny, head=obj.draft, adapter=obj.adapter, foresight="on", B=4)
    assert not other.capturable(TREE_POLICIES.build("ddtree"))  # not capturable on the CPU: the host round's foresight
    assert not other.branches and other.foresees


@st.composite
def outcomes(draw):  # type: ignore[no-untyped-def]
    """A random tree over a small vocabulary (repeated tokens), B random keyed outcomes of it and one
    verified outcome (a node's path and a bonus), often one of the keys."""
    n = draw(st.integers(2, 9))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    tokens = [draw(st.integers(0, 3)) for _ in range(n)]
    b = draw(st.integers(1, 6))
    nodes = [draw(st.integers(0, n - 1)) for _ in range(b)]
    bonus = [draw(st.integers(0, 3)) for _ in range(b)]
    valid = [draw(st.booleans()) for _ in range(b)]
    if draw(st.booleans()):
        v, a = nodes[0], bonus[0]
    else:
        v, a = draw(st.integers(0, n - 1)), draw(st.integers(0, 3))
    return parents, tokens, nodes, bonus, valid, v, a


def _path(parents: list[int], v: int) -> list[int]:
    path = [v]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


@settings(max_examples=300, deadline=None)
@given(outcomes())
def test_the_device_lookup_serves_only_the_verified_outcome(case) -> None:  # type: ignore[no-untyped-def]
    parents, tokens, nodes, bonus, valid, v, a = case
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    tree = DraftTree(tokens=torch.tensor(tokens), parents=torch.tensor(parents), depth=torch.tensor(depth))
    masks = ancestor_masks(torch.tensor([parents, [-1] * len(parents)]), max(depth))  # batched: this tree, a forest
    want = torch.tensor([[j in _path(parents, i) for j in range(len(parents))] for i in range(len(parents))])
    assert torch.equal(masks[0], want) and torch.equal(masks[1], torch.eye(len(parents), dtype=torch.bool))
    key_len, key_tokens = outcome_keys(tree, torch.tensor(nodes))
    path = _path(parents, v)
    count = torch.tensor([len(path)])
    padded = torch.tensor(path + [-1] * (len(parents) - len(path)))
    hit, index = match(key_len, key_tokens, torch.tensor(bonus), torch.tensor(valid), count,
                       verified_key(tree, padded, count), torch.tensor([a]))
    outcome = lambda u, x: Outcome(0, tuple(tokens[w] for w in _path(parents, u)[1:]), x)  # noqa: E731
    verified = outcome(v, a)
    served = [i for i in range(len(nodes)) if valid[i] and outcome(nodes[i], bonus[i]) == verified]
    assert bool(hit) == bool(served)
    if served:
        assert int(index) == served[0], "not the first key of the verified outcome (the host cache keeps the first)"


def test_device_foresight_with_the_ngram_expert_equals_the_host_round_and_ar(tiny, trained_jpp, ar_tokens) -> None:
    """The n-gram expert's device context buffer (filled at begin, appended in the lookup) scores as the
    host round's committed tokens do: same hits, same trees, AR's tokens."""
    obj, _ = trained_jpp
    cal = RowTemperature((16.0,), (4.0, 8.0, 2.0))  # strong boosts: they change the selection
    make = lambda **kw: JetSpecPPDrafter(tiny, head=obj.draft, adapter=obj.adapter, J=1, R=1, foresight="on", B=4,  # noqa: E731
                                         calibration=cal, pipeline="sequential", **kw)
    plain = run(tiny, JetSpecPPDrafter(tiny, head=obj.draft, adapter=obj.adapter, J=1, R=1, foresight="on", B=4,
                                       calibration=RowTemperature((16.0,)), pipeline="sequential", host=True), "chain", 5)
    device = run(tiny, make(), "chain", 5, check=no_host_reads)
    host = run(tiny, make(host=True), "chain", 5)
    for (d_tokens, d_trees, d_hits), (h_tokens, h_trees, h_hits), want in zip(device, host, ar_tokens):
        assert d_tokens == h_tokens == want
        assert d_hits == h_hits and d_trees == h_trees
    assert [h for _, _, h in host] != [h for _, _, h in plain], "the boosts changed no hit: the test would not see them"
