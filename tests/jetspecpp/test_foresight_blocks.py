"""Foresight's batched drafting is the critical-path draft on the states it assumes: for every selected
outcome (u, a) of a block, the block drafted ahead equals (float64, to 1e-9) what a fresh drafter drafts
after committing the root and the path to u with the *predicted* states of those positions and anchor
a — through J0, the refreshes (adapter, decoder, anchor replacement; the oracle for `true`) and the
Jacobi passes, for chains and trees, under every state source."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SamplingConfig
from specbench.drafters.base import DraftState
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.models.decoder import ForwardOutput
from specbench.trees import TREE_POLICIES
from specbench.verify.base import TorchRandomness

from jetspecpp_helpers import random_parts, tiny_exact_target

PROMPT = [1, 3, 0, 2, 4, 1, 1]
ANCHOR = 3
SLOTS = 64


def begin(target, drafter, prompt: list[int], anchor: int, hidden=None) -> DraftState:  # type: ignore[no-untyped-def]
    """A request begun on `drafter` whose committed positions have states `hidden` (tap -> [1, n, d];
    default: the target's own, from a prefill of `prompt`)."""
    n = len(prompt)
    if hidden is None:
        out = target.forward(torch.tensor([prompt]), torch.arange(n)[None], target.new_cache(SLOTS), None, drafter.taps)
        hidden = out.hidden
    state = DraftState(tokens=list(prompt) + [anchor], prompt_len=n, sampling=SamplingConfig(), draft_rng=TorchRandomness(0))
    drafter.begin(state, ForwardOutput(logits=torch.empty(0), hidden=hidden), SLOTS)
    return state


@pytest.mark.parametrize("states", ["predicted", "stale", "true"])
@pytest.mark.parametrize("policy,budget", [("chain", 3), ("ddtree", 6)])
def test_blocks_drafted_ahead_are_critical_path_drafts_on_the_predicted_states(states: str, policy: str, budget: int) -> None:
    target = tiny_exact_target(vocab=7, seed=1)
    head, adapter = random_parts(target, taps=(0,), block_size=4, seed=3)
    make = lambda **kw: JetSpecPPDrafter(target, head=head, adapter=adapter, J=2, R=2, states=states, **kw)  # noqa: E731
    drafter = make(foresight="on", B=10, host=True)  # the host round (its foresight is the reference)
    state = begin(target, drafter, PROMPT, ANCHOR)
    tree = drafter.draft(state, TREE_POLICIES.build(policy), budget)
    drafter.foresee(state, tree)
    done = drafter.foresight.pending
    nodes, bonus, valid = done.selection.tolist()
    assert sum(valid) == 10
    true = target.forward(torch.tensor([PROMPT]), torch.arange(len(PROMPT))[None], target.new_cache(SLOTS), None, (0,)).hidden
    tokens = tree.host[0]
    depths = set()
    for row, (u, a, ok) in enumerate(zip(nodes, bonus, valid)):
        path = tree.path_to(u)
        depths.add(len(path) - 1)
        hidden = {0: torch.cat([true[0], done.states[:, path]], dim=1)}  # committed: true prefix, predicted path
        fresh = make()
        committed = PROMPT + [tokens[v] for v in path]
        state2 = DraftState(tokens=committed + [a], prompt_len=len(PROMPT), sampling=SamplingConfig(),
                            draft_rng=TorchRandomness(0))
        fresh.begin(state2, ForwardOutput(logits=torch.empty(0), hidden=hidden), SLOTS)
        want = fresh.refined_logp(state2)
        torch.testing.assert_close(done.blocks[row], want, atol=1e-9, rtol=0)
        assert [int(k) for k in fresh.last_round["k_hat"]] == [int(k[row]) for k in done.k_hats]
    assert len(depths) > 1, "the selection never left the root: deeper outcomes untested"
