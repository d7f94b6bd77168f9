"""The speculation cache never serves a block drafted for an outcome other than the verified one
(hypothesis over random outcome sequences): the cache alone (random selections, random verified
outcomes, stale entries from earlier blocks), and the drafter driven through rounds whose verified
outcome is drawn at random (selected or not): a block is served exactly when the verified outcome was
selected, and the served block is the one drafted for that outcome (recomputed alone, float64)."""

from __future__ import annotations

import functools

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.config import SamplingConfig
from specbench.drafters.base import DraftState
from specbench.drafters.jetspecpp.cache import Entry, Outcome, SpeculationCache
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.drafters.jetspecpp.foresight import OutcomeBatch
from specbench.models.decoder import ForwardOutput
from specbench.trees import TREE_POLICIES
from specbench.verify.base import TorchRandomness, VerifyResult

from jetspecpp_helpers import random_parts, tiny_exact_target

outcomes = st.builds(Outcome, base=st.integers(0, 3), accepted=st.lists(st.integers(0, 2), max_size=2).map(tuple),
                     bonus=st.integers(0, 2))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(outcomes, max_size=6), outcomes), min_size=1, max_size=6))
def test_the_cache_serves_only_the_verified_outcomes_block(rounds) -> None:  # type: ignore[no-untyped-def]
    cache = SpeculationCache()
    for selected, verified in rounds:
        # each block tagged with the outcome it was drafted for; a round may fill nothing (a pass that never ran)
        if selected:
            cache.fill(Entry(outcome=o, node=i, row=i, path=(0,), states=torch.empty(0), block=torch.tensor([hash(o)]))
                       for i, o in enumerate(selected))
        entry = cache.take(verified)
        if entry is None:
            assert verified not in selected
        else:
            assert entry.outcome == verified and int(entry.block) == hash(verified)
            assert entry.row == selected.index(verified)  # the first entry drafted for it
        assert len(cache) == 0  # nothing survives into the next block


PROMPT = [1, 4, 2, 0, 5]


@functools.lru_cache(maxsize=1)
def parts():  # type: ignore[no-untyped-def]
    """The tiny target, head and adapter, built on first use (not at collection: building a model
    imports torch's compiler stack, and with it triton, before the kernel tests set the interpreter)."""
    target = tiny_exact_target(vocab=6, seed=2)
    return (target, *random_parts(target, taps=(0,), block_size=4, seed=5))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["chain", "ddtree"]), states=st.sampled_from(["predicted", "stale", "true"]),
       choices=st.lists(st.tuples(st.booleans(), st.integers(0, 10 ** 6)), min_size=3, max_size=6))
def test_the_drafter_serves_the_block_drafted_for_the_verified_outcome(policy, states, choices) -> None:  # type: ignore[no-untyped-def]
    target, head, adapter = parts()
    drafter = JetSpecPPDrafter(target, head=head, adapter=adapter, J=1, R=1, states=states, foresight="on", B=5, host=True)
    tree_policy = TREE_POLICIES.build(policy)
    n0 = len(PROMPT)
    prefill = target.forward(torch.tensor([PROMPT]), torch.arange(n0)[None], target.new_cache(64), None, drafter.taps)
    state = DraftState(tokens=PROMPT + [3], prompt_len=n0, sampling=SamplingConfig(), draft_rng=TorchRandomness(0))
    drafter.begin(state, prefill, 64)
    g = torch.Generator().manual_seed(0)
    expected = None
    for pick_selected, seed in choices:
        tree = drafter.draft(state, tree_policy, 6)
        if expected is not None:  # the last round's verified outcome was selected: its block must be served
            torch.testing.assert_close(drafter.last_logp, expected, atol=1e-9, rtol=0)
        assert drafter.foresight.log[-1]["hit"] is (None if len(drafter.foresight.log) == 1 else expected is not None)
        drafter.foresee(state, tree)
        p = drafter.foresight.pending
        nodes, bonus, valid = p.selection.tolist()
        tokens, parents, _ = tree.host
        chosen = [(u, a) for u, a, ok in zip(nodes, bonus, valid) if ok]
        if pick_selected:
            u, a = chosen[seed % len(chosen)]
        else:  # any outcome a walk can end in: a node and a bonus that is not one of its children's tokens
            possible = [(v, t) for v in range(tree.num_nodes) for t in range(target.config.vocab_size)
                        if t not in {tokens[c] for c in tree.children[v]}]
            u, a = possible[seed % len(possible)]
        path = tree.path_to(u)
        outcome_selected = any(tree.path_to(v) == path and b == a for v, b in chosen)
        # the block drafted for (u, a) alone, before observe changes any cache
        alone = OutcomeBatch(drafter, state, tree, {0: p.states}, torch.tensor([u]), torch.tensor([a])).refined_logp()[0][0]
        expected = alone if outcome_selected else None
        hidden = {0: torch.randn(1, tree.num_nodes, target.config.hidden_size, generator=g, dtype=target.dtype)}
        result = VerifyResult(path=path, tokens=[tokens[v] for v in path[1:]] + [a])
        drafter.observe(tree, result, ForwardOutput(logits=torch.empty(0), hidden=hidden))
        state.tokens.extend(result.tokens)
    drafter.draft(state, tree_policy, 6)
    assert drafter.foresight.log[-1]["hit"] is (expected is not None)
    if expected is not None:
        torch.testing.assert_close(drafter.last_logp, expected, atol=1e-9, rtol=0)


def test_after_a_hit_later_rounds_read_the_true_states_of_the_accepted_positions() -> None:
    target, head, adapter = parts()
    drafter = JetSpecPPDrafter(target, head=head, adapter=adapter, J=1, R=1, foresight="on", B=5, host=True)
    policy = TREE_POLICIES.build("chain")
    n0 = len(PROMPT)
    prefill = target.forward(torch.tensor([PROMPT]), torch.arange(n0)[None], target.new_cache(64), None, drafter.taps)
    state = DraftState(tokens=PROMPT + [3], prompt_len=n0, sampling=SamplingConfig(), draft_rng=TorchRandomness(0))
    drafter.begin(state, prefill, 64)
    tree = drafter.draft(state, policy, 3)
    drafter.foresee(state, tree)
    p = drafter.foresight.pending
    nodes, bonus, valid = p.selection.tolist()
    u, a = max(((u, a) for u, a, ok in zip(nodes, bonus, valid) if ok), key=lambda x: x[0])  # the deepest selected
    path = tree.path_to(u)
    true = torch.randn(1, tree.num_nodes, target.config.hidden_size, generator=torch.Generator().manual_seed(1),
                       dtype=target.dtype)
    result = VerifyResult(path=path, tokens=[tree.host[0][v] for v in path[1:]] + [a])
    drafter.observe(tree, result, ForwardOutput(logits=torch.empty(0), hidden={0: true}))
    state.tokens.extend(result.tokens)
    entry = drafter.foresight.ready
    assert entry is not None and entry.path == tuple(path)
    assert not torch.allclose(entry.accepted_states, true[:, path])  # it was drafted from predicted states
    drafter.draft(state, policy, 3)  # the hit
    assert drafter.foresight.log[-1]["hit"] is True
    n = n0
    pos = torch.arange(n, n + len(path))[None]
    for i, (k, v) in enumerate(drafter.head.context_kv(true[:, path], pos, target.model)):
        torch.testing.assert_close(drafter.cache.k[i, :, :, n: n + len(path)], k, atol=1e-12, rtol=0)
        torch.testing.assert_close(drafter.cache.v[i, :, :, n: n + len(path)], v, atol=1e-12, rtol=0)
    drafter.block_states(state, torch.tensor([a]), torch.zeros(1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool))
    ctx = drafter.adapter_caches[0]
    for i, (k, _) in enumerate(drafter.adapter.tap(0).context_kv(true[:, path], pos, target.model)):
        torch.testing.assert_close(ctx.cache.k[i, :, :, n: n + len(path)], k, atol=1e-12, rtol=0)
