"""jetspec++'s device round (capturable at T = 0) against its host round, fp32, in the real decode loop
on the CPU: at every (J, R, replacement) setting and each state source, the device path (phases and
observe run without a host read from the second round on) drafts the same trees round by round as the
host path, and both emit exactly the AR greedy tokens. The device caches equal a batched projection."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SpecConfig
from specbench.drafters.heads.masks import block_pattern
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.engine import SpecDecoder
from specbench.models.decoder import ForwardOutput
from specbench.trees.base import DraftTree
from specbench.verify.base import VerifyResult

from host_reads import no_host_reads
from jetspecpp_helpers import GRID, NEW, PROMPTS, begun, random_parts



def rounds(tiny, drafter, tree: str, budget: int, check=None):  # type: ignore[no-untyped-def]
    """(tokens, [tree tokens + parents per round], accepted drafts) of every prompt; `check` wraps the
    captured stages."""
    decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec++", tree=tree, budget=budget), max_seq_len=160,
                          drafter=drafter, capture_check=check)
    assert decoder.device_drafting is (check is not None)
    out = []
    for prompt in PROMPTS:
        seen: list[list[int]] = []
        result = decoder.generate(prompt, NEW, on_round=lambda i, t, r: seen.append(t.tokens.tolist() + t.parents.tolist()))
        out.append((result.tokens, seen, sum(r.accepted for r in result.stats.rounds)))
    return out


@pytest.mark.parametrize("J,R,replace", GRID)
def test_device_round_drafts_the_host_rounds_trees(tiny, trained_jpp, ar_tokens, J: int, R: int, replace: bool) -> None:
    obj, _ = trained_jpp
    make = lambda **kw: JetSpecPPDrafter(tiny, head=obj.draft, adapter=obj.adapter, J=J, R=R, replace=replace, **kw)  # noqa: E731
    for tree, budget in (("chain", 5), ("ddtree-vec", 8)):
        device = rounds(tiny, make(), tree, budget, check=no_host_reads)
        host = rounds(tiny, make(host=True), tree, budget)
        for (d_tokens, d_trees, _), (h_tokens, h_trees, _), want in zip(device, host, ar_tokens):
            assert d_tokens == h_tokens == want, f"J{J} R{R} replace={replace} {tree}: diverged from AR greedy"
            assert d_trees == h_trees, f"J{J} R{R} replace={replace} {tree}: the device round drafted other trees"
        assert sum(a for _, _, a in device) > 0, "no draft was ever accepted: the padded commits were not exercised"


@pytest.mark.parametrize("states", ["stale", "true"])
def test_device_round_with_state_ablations(tiny, trained_jpp, ar_tokens, states: str) -> None:
    obj, _ = trained_jpp
    make = lambda **kw: JetSpecPPDrafter(tiny, head=obj.draft, adapter=obj.adapter, J=2, R=2, states=states, **kw)  # noqa: E731
    device = rounds(tiny, make(), "ddtree-vec", 8, check=no_host_reads)
    host = rounds(tiny, make(host=True), "ddtree-vec", 8)
    assert [r[0] for r in device] == [r[0] for r in host] == ar_tokens
    assert [r[1] for r in device] == [r[1] for r in host]


def test_the_host_round_is_kept_where_the_device_round_is_not() -> None:
    """Recorded or score-only foresight, another draft device or host=true: the host round (the engine
    drafts on the host); served foresight from predicted states runs in the device round."""
    from specbench.models import load_target
    from specbench.trees import TREE_POLICIES

    tiny = load_target("random:tiny-llama")
    head, adapter = random_parts(tiny)
    chain = TREE_POLICIES.build("chain")
    assert JetSpecPPDrafter(tiny, head=head, adapter=adapter).capturable(chain)
    assert not JetSpecPPDrafter(tiny, head=head, adapter=adapter, host=True).capturable(chain)
    assert JetSpecPPDrafter(tiny, head=head, adapter=adapter, foresight="on").capturable(chain)  # device foresight
    assert not JetSpecPPDrafter(tiny, head=head, adapter=adapter, foresight="on", record=True).capturable(chain)
    assert not JetSpecPPDrafter(tiny, head=head, adapter=adapter, foresight="score").capturable(chain)
    assert not JetSpecPPDrafter(tiny, head=head, adapter=adapter).capturable(TREE_POLICIES.build("ddtree"))  # host on the CPU
    with pytest.raises(ValueError, match="host .run the host-driven round"):
        JetSpecPPDrafter(tiny, head=head, adapter=adapter, host="yes")


SEQ = [5, 17, 33, 2, 90, 41, 7, 7, 60, 12, 3, 44]


def test_device_caches_match_one_batched_pass(tiny) -> None:
    """Context committed in pieces (prefill, then padded accepted paths) = the batched projection of the
    adapter module and the target's own upper layers: the predicted block states and the decoder's
    logits equal the host path's against the whole prefix at once."""
    head, adapter = random_parts(tiny, taps=(0,))
    drafter = JetSpecPPDrafter(tiny, head=head, adapter=adapter, J=1, R=1)
    state = begun(tiny, drafter, SEQ[:4], SEQ[4])
    full = tiny.forward(torch.tensor([SEQ]), torch.arange(len(SEQ))[None], tiny.new_cache(32), None, (0,))
    for n_new in (3, 2):  # two rounds accepting a chain of n_new positions of a 5-node chain tree each
        start = state.cache_len
        tree = DraftTree.chain(SEQ[start], SEQ[start + 1: start + 5])
        hidden = {0: full.hidden[0][:, start: start + 5]}
        drafter.observe(tree, VerifyResult(path=list(range(n_new)), tokens=SEQ[start + 1: start + n_new + 1]),
                        ForwardOutput(logits=torch.empty(0), hidden=hidden))
        state.tokens.extend(SEQ[start + 1: start + n_new + 1])
    n = state.cache_len
    block, q = torch.tensor(SEQ[n: n + 3]), 3
    within = block_pattern(q, "block-causal")
    got = drafter.block_states(state, block, torch.arange(q), within)[0]
    m = adapter.tap(0)
    kv = m.context_kv(full.hidden[0][:, :n], torch.arange(n)[None], tiny.model)
    mask = torch.cat([torch.ones(q, n, dtype=torch.bool), within], dim=1)[None]
    torch.testing.assert_close(got, m(block[None], (n + torch.arange(q))[None], kv, mask, tiny.model), atol=1e-5, rtol=1e-5)
    # the decoder on the true states of the block: the target's logits
    logits = drafter.device_states.decoder.read(full.hidden[0][:, n: n + q], torch.arange(q), within, n + q)
    torch.testing.assert_close(logits, full.logits[0, n: n + q], atol=1e-4, rtol=1e-4)
