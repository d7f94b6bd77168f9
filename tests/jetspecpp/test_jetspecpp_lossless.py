"""jetspec++ at T > 0, exactly: the whole SpecDecoder with the refining drafter (refreshes and anchor
replacement included) on a float64 target over 5 tokens, every random draw enumerated (drafting and
verification share one enumerator), emits the first tokens with exactly the law of ancestral sampling
under every verifier the drafter supports. And the draft law a rejection sampler reads is the law the
final tokens were drawn from."""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

import pytest
import torch

from specbench.config import SamplingConfig, SpecConfig
from specbench.drafters.base import DraftState
from specbench.drafters.heads.masks import block_pattern
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
from specbench.engine import SpecDecoder
from specbench.trees import TREE_POLICIES
from specbench.verify import EnumeratingRandomness, ar_law, enumerate_law, law_gap
from specbench.verify.exact import enumerate_outcomes
from specbench.verify.sampling import process_logits

from jetspecpp_helpers import random_parts, tiny_exact_target


def block_logp_from_context(head, target, ctx_kv, tokens, is_mask, depth, within):
    """The head's uncached forward over one block against context K/V of n positions (all visible):
    tokens, is_mask, depth [Q] (positions n + depth), within [Q, Q] -> log-probs [Q, V]; an
    independent path from the drafter's cached `run_block`."""
    model, n, q = target.model, ctx_kv[0][0].shape[2], tokens.shape[0]
    mask = torch.cat([torch.ones(q, n, dtype=torch.bool, device=within.device), within], dim=1)[None]
    hidden = head(head.embed_block(tokens[None], is_mask[None], model), (n + depth)[None], ctx_kv, mask, model)[0]
    return torch.log_softmax(head.logits(hidden, model.lm_head.weight).float(), dim=-1)

PROMPT = [1, 3, 0, 2]
NEW_TOKENS = 3
BLOCK = 3  # anchor + 2 drafts


@lru_cache(maxsize=None)
def target_law(sampling: SamplingConfig) -> dict:
    target = tiny_exact_target()

    def next_law(path: tuple[int, ...]) -> torch.Tensor:
        ids = torch.tensor([PROMPT + list(path)])
        out = target.forward(ids, torch.arange(ids.shape[1])[None], target.new_cache(32), logits_rows="last")
        return process_logits(out.logits[0, -1], sampling)

    return ar_law(next_law, NEW_TOKENS)


def make_drafter(target, J: int, R: int, states: str = "predicted", seed: int = 4) -> JetSpecPPDrafter:  # type: ignore[no-untyped-def]
    head, adapter = random_parts(target, taps=(0,), block_size=BLOCK, seed=seed)
    return JetSpecPPDrafter(target, head=head, adapter=adapter, J=J, R=R, states=states)


CASES = [  # verifier, top_k, tree, budget, J, R, states (the untrained head's top-1 rarely is among the
    # target's top 2, so the walk over a deterministic chain runs on the whole vocabulary)
    ("sample-walk", 0, "chain", 2, 1, 1, "predicted"),
    ("sample-walk", 2, "ddtree", 3, 2, 1, "predicted"),
    ("chain-rs", 2, "chain", 2, 0, 0, "predicted"),
    ("chain-rs", 2, "chain", 2, 1, 1, "predicted"),
    ("chain-rs", 2, "chain", 2, 2, 2, "true"),
    ("tree-rrs", 2, "chain", 2, 1, 1, "predicted"),
    ("traversal", 2, "chain", 2, 2, 1, "stale"),
]


@pytest.mark.parametrize("verifier,top_k,tree,budget,J,R,states", CASES)
def test_engine_law_of_first_tokens_is_ar_law(verifier, top_k, tree, budget, J, R, states) -> None:  # type: ignore[no-untyped-def]
    target = tiny_exact_target()
    sampling = SamplingConfig(temperature=1.0, top_k=top_k)
    drafter = make_drafter(target, J, R, states)
    decoder = SpecDecoder(target, SpecConfig(drafter="jetspec++", tree=tree, verifier=verifier, budget=budget),
                          drafter=drafter, max_seq_len=32)
    accepted = []

    def run(rng) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
        res = decoder.generate(PROMPT, NEW_TOKENS, sampling, rng=rng, draft_rng=rng,
                               on_round=lambda i, t, r: accepted.append(r.accepted_drafts))
        return tuple(res.tokens)

    law = enumerate_law(run)
    assert law_gap(law, target_law(sampling)) < 1e-12
    assert max(accepted) == (budget if tree == "chain" else 2)  # whole chains / the tree's deepest paths accepted


def test_draft_law_is_the_law_the_final_tokens_were_drawn_from() -> None:
    """Enumerating the draft draws of one round: every drafted chain has probability prod_d q_d(t_d)
    with q the recorded draft_probs, which are the same in every outcome and equal the processed law
    of the last pass run over the refined inputs (J0 top-1, then one pass over those tokens)."""
    target = tiny_exact_target()
    drafter = make_drafter(target, J=2, R=0)
    sampling = SamplingConfig(temperature=0.9, top_k=3)
    n = len(PROMPT)
    prefill = target.forward(torch.tensor([PROMPT]), torch.arange(n)[None], target.new_cache(32), None, drafter.taps)
    chain = TREE_POLICIES.build("chain")
    anchor = 4

    def draw(rng):  # type: ignore[no-untyped-def]
        state = DraftState(tokens=PROMPT + [anchor], prompt_len=n, sampling=sampling, draft_rng=rng, want_draft_probs=True)
        drafter.begin(state, prefill, 32)
        return drafter.draft(state, chain, BLOCK - 1)

    law: dict[tuple[int, ...], float] = defaultdict(float)
    rows = []
    for tree, p in enumerate_outcomes(draw):
        law[tuple(tree.tokens[1:].tolist())] += p
        rows.append(tree.draft_probs[1:])
    assert all(torch.equal(r, rows[0]) for r in rows)
    q = rows[0]  # [D, V]
    q64 = q.double() / q.double().sum(-1, keepdim=True)  # what draws and verifiers read (normalised in float64)
    assert len(law) > 1 and abs(sum(law.values()) - 1) < 1e-12
    for tokens, p in law.items():
        assert p == pytest.approx(float(torch.prod(q64[torch.arange(len(tokens)), torch.tensor(tokens)])), abs=1e-14)
    # the independent computation of the last pass's law
    state = DraftState(tokens=PROMPT + [anchor], prompt_len=n, sampling=sampling, draft_rng=EnumeratingRandomness())
    drafter.begin(state, prefill, 32)  # writes the prompt's context K/V
    ctx = [(drafter.cache.k[i, :, :, :n], drafter.cache.v[i, :, :, :n]) for i in range(drafter.head.config.num_layers)]
    depth, within = torch.arange(BLOCK), block_pattern(BLOCK, "block-causal")
    inputs = torch.full((BLOCK,), anchor)
    mask_in = torch.arange(BLOCK) > 0
    for _ in range(1 + 2):  # J0 (MASK inputs), then the two token passes
        logp = block_logp_from_context(drafter.head, target, ctx, inputs, mask_in, depth, within)[1:]
        inputs = torch.cat([torch.tensor([anchor]), logp.max(-1).indices])
        mask_in = torch.zeros(BLOCK, dtype=torch.bool)
    torch.testing.assert_close(q, process_logits(logp, sampling), atol=1e-12, rtol=0)


def test_sampled_drafts_need_the_chain_policy() -> None:
    target = tiny_exact_target()
    decoder = SpecDecoder(target, SpecConfig(drafter="jetspec++", tree="ddtree", verifier="chain-rs", budget=2),
                          drafter=make_drafter(target, 1, 1), max_seq_len=32)
    with pytest.raises(ValueError, match="need the chain policy"):
        decoder.generate(PROMPT, 3, SamplingConfig(temperature=1.0))


class RecordsJ0Law(JetSpecPPDrafter):
    """Wrong on purpose: draws from the last pass's law but records its average with J0's (the
    support still covers every drawn token, so only the law is wrong)."""

    def draft(self, state, policy, budget):  # type: ignore[no-untyped-def]
        j0 = self.block_logp(state)
        tree = super().draft(state, policy, budget)
        if tree.draft_probs is not None:
            j0_law = process_logits(j0[: tree.num_nodes - 1], state.sampling)
            tree.draft_probs[1:] = 0.5 * (tree.draft_probs[1:] + j0_law)
        return tree


def test_the_exact_check_catches_a_wrong_draft_law() -> None:
    target = tiny_exact_target()
    head, adapter = random_parts(target, taps=(0,), block_size=BLOCK, seed=4)
    drafter = RecordsJ0Law(target, head=head, adapter=adapter, J=2, R=1)
    sampling = SamplingConfig(temperature=1.0, top_k=2)
    decoder = SpecDecoder(target, SpecConfig(drafter="jetspec++", tree="chain", verifier="chain-rs", budget=2),
                          drafter=drafter, max_seq_len=32)
    law = enumerate_law(lambda rng: tuple(decoder.generate(PROMPT, NEW_TOKENS, sampling, rng=rng, draft_rng=rng).tokens))
    assert law_gap(law, target_law(sampling)) > 1e-4
