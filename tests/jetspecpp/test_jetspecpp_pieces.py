"""The jetspec++ pieces: the training-free decoder on true states reproduces the target's logits; the
oracle (`states=true`) gives the target's own block states; the adapter's context cache equals one
batched projection; the outcome distribution P̂(k, a) sums to 1 and is exactly the law of a walk
verifier's outcome (by enumeration, small vocabularies)."""

from __future__ import annotations

import pytest
import torch

from specbench.drafters.heads.masks import block_pattern
from specbench.drafters.jetspecpp.decoder import SliceDecoder
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.drafters.jetspecpp.outcomes import outcome_distribution, tree_outcome_distribution
from specbench.trees.base import DraftTree
from specbench.verify import VERIFIERS, exact_law

from jetspecpp_helpers import begun, random_parts

SEQ = [5, 17, 33, 2, 90, 41, 7, 7, 60, 12, 3, 44]


@pytest.mark.parametrize("top", [0, 1])
def test_decoder_on_true_states_is_the_target(tiny, top: int) -> None:
    """Context: the first n positions' true top-tap states; block: the next rows' true states (a
    chain, and a tree with its ancestor mask): the decoder's logits equal the target's."""
    n = 7
    seq = torch.tensor([SEQ])
    full = tiny.forward(seq, torch.arange(len(SEQ))[None], tiny.new_cache(32), None, (top,))
    dec = SliceDecoder(tiny, top, 32)
    dec.extend(full.hidden[top][:, :n])
    q = len(SEQ) - n
    logits = dec.read(full.hidden[top][:, n:], torch.arange(q), block_pattern(q, "block-causal"))
    torch.testing.assert_close(logits, full.logits[0, n:], atol=1e-4, rtol=1e-4)
    # a tree: two branches below the anchor; each node's logits = the target run along its own path
    tree = DraftTree.from_paths(SEQ[n], [[SEQ[n + 1], SEQ[n + 2]], [9, 4]])
    cache = tiny.new_cache(32)
    tiny.forward(seq[:, :n], torch.arange(n)[None], cache, None, ())
    cache.advance(n)
    out = tiny.forward(tree.tokens[None], (n + tree.depth)[None], cache, tree.ancestor_mask[None], (top,))
    logits = dec.read(out.hidden[top], tree.depth, tree.ancestor_mask)
    torch.testing.assert_close(logits, out.logits[0], atol=1e-4, rtol=1e-4)
    assert dec.length == n  # reads never commit


def test_true_states_are_the_targets_block_states(tiny) -> None:
    head, adapter = random_parts(tiny, taps=(0, 1))
    drafter = JetSpecPPDrafter(tiny, head=head, adapter=adapter, J=1, R=1, states="true")
    prompt = SEQ[:6]
    state = begun(tiny, drafter, prompt, SEQ[6])
    block = torch.tensor(SEQ[6:11])
    got = drafter.block_states(state, block, torch.arange(5), block_pattern(5, "block-causal"))
    full = tiny.forward(torch.tensor([SEQ[:11]]), torch.arange(11)[None], tiny.new_cache(32), None, (0, 1))
    for t in (0, 1):
        torch.testing.assert_close(got[t], full.hidden[t][:, 6:11], atol=1e-5, rtol=1e-5)


def test_adapter_context_cache_matches_one_batched_pass(tiny) -> None:
    """Context written in pieces (prefill, then accepted paths) = the batched projection; predicted
    block states equal a block pass against the batched context."""
    head, adapter = random_parts(tiny, taps=(0, 1))
    drafter = JetSpecPPDrafter(tiny, head=head, adapter=adapter, J=1, R=1, host=True)  # the host round's caches
    state = begun(tiny, drafter, SEQ[:4], SEQ[4])
    full = tiny.forward(torch.tensor([SEQ]), torch.arange(len(SEQ))[None], tiny.new_cache(32), None, (0, 1))
    from specbench.models.decoder import ForwardOutput
    from specbench.verify.base import VerifyResult

    for n_new in (3, 2):  # two rounds accepting a chain of n_new positions each
        start = state.cache_len
        tree = DraftTree.chain(SEQ[start], SEQ[start + 1: start + n_new])
        hidden = {t: full.hidden[t][:, start: start + n_new] for t in (0, 1)}
        drafter.block_states(state, tree.tokens, tree.depth, tree.ancestor_mask)  # syncs the queued positions
        drafter.observe(tree, VerifyResult(path=list(range(n_new)), tokens=SEQ[start + 1: start + n_new + 1]),
                        ForwardOutput(logits=torch.empty(0), hidden=hidden))
        state.tokens.extend(SEQ[start + 1: start + n_new + 1])
    n = state.cache_len
    block = torch.tensor(SEQ[n: n + 3])
    got = drafter.block_states(state, block, torch.arange(3), block_pattern(3, "block-causal"))
    for t in (0, 1):
        m = adapter.tap(t)
        cache = drafter.adapter_caches[t]
        kv = m.context_kv(full.hidden[t][:, :n], torch.arange(n)[None], tiny.model)
        for i, (k, v) in enumerate(kv):
            torch.testing.assert_close(cache.cache.k[i, :, :, :n], k, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(cache.cache.v[i, :, :, :n], v, atol=1e-5, rtol=1e-5)
        mask = torch.cat([torch.ones(3, n, dtype=torch.bool), block_pattern(3, "block-causal")], dim=1)[None]
        want = m(block[None], (n + torch.arange(3))[None], kv, mask, tiny.model)
        torch.testing.assert_close(got[t], want, atol=1e-5, rtol=1e-5)


def random_rows(n: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = torch.rand(n, vocab, generator=g, dtype=torch.float64) ** 3
    rows[rows < 0.05] = 0.0  # some zeros
    rows[:, 0] += 1e-3
    return rows / rows.sum(-1, keepdim=True)


@pytest.mark.parametrize("seed", range(4))
def test_chain_outcomes_sum_to_one_and_are_the_walk_law(seed: int) -> None:
    vocab, gamma = 4, 3
    g = torch.Generator().manual_seed(100 + seed)
    drafts = torch.randint(vocab, (gamma,), generator=g)
    rows = random_rows(gamma + 1, vocab, seed)
    P = outcome_distribution(drafts, rows)  # [γ+1, V]
    assert P.dtype == torch.float64 and abs(float(P.sum()) - 1.0) < 1e-12
    law = exact_law(VERIFIERS.build("sample-walk"), DraftTree.chain(9, drafts.tolist()), rows)
    want = torch.zeros_like(P)
    for seq, p in law.items():
        want[len(seq) - 1, seq[-1]] += p  # k = accepted drafts, a = the bonus
    torch.testing.assert_close(P, want, atol=1e-14, rtol=0)
    # by hand: P(k, a) = prod_{i<=k} p(d_i|i-1) * p(a|k) * [a != d_{k+1}]
    k, a = 1, int((drafts[1] + 1) % vocab)
    assert float(P[k, a]) == pytest.approx(float(rows[0, drafts[0]] * rows[1, a]), abs=1e-15)
    assert float(P[0, drafts[0]]) == 0.0


def test_tree_outcomes_with_duplicate_siblings() -> None:
    vocab = 3
    tree = DraftTree(tokens=torch.tensor([0, 1, 1, 2, 0, 2]), parents=torch.tensor([-1, 0, 0, 0, 1, 4]),
                     depth=torch.tensor([0, 1, 1, 1, 2, 3]))  # node 2 repeats node 1's token: unreachable
    rows = random_rows(6, vocab, 11)
    P = tree_outcome_distribution(tree.parents.tolist(), tree.tokens.tolist(), rows)
    assert abs(float(P.sum()) - 1.0) < 1e-12 and float(P[2].sum()) == 0.0
    law = exact_law(VERIFIERS.build("sample-walk"), tree, rows)
    paths = {(): 0, (1,): 1, (2,): 3, (1, 0): 4, (1, 0, 2): 5}
    want = torch.zeros_like(P)
    for seq, p in law.items():
        want[paths[seq[:-1]], seq[-1]] += p
    torch.testing.assert_close(P, want, atol=1e-14, rtol=0)


def test_drafter_outcome_distribution_sums_to_one(tiny) -> None:
    from specbench.config import SamplingConfig

    head, adapter = random_parts(tiny)
    drafter = JetSpecPPDrafter(tiny, head=head, adapter=adapter, J=1, R=1)
    state = begun(tiny, drafter, SEQ[:6], SEQ[6])
    drafts = torch.tensor(SEQ[7:11])
    for sampling in (None, SamplingConfig(temperature=0.7, top_k=5)):
        P = drafter.outcome_distribution(state, drafts, sampling)
        assert P.shape == (5, tiny.config.vocab_size) and abs(float(P.sum()) - 1.0) < 1e-9
        assert all(float(P[k, drafts[k]]) == 0.0 for k in range(4))
