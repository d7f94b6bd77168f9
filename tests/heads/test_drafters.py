"""The DFlash-family drafters in the real decode loop (fp32): greedy SD emits exactly the AR greedy
tokens; the draft cache holds every committed position exactly once, with the right features;
jetspec-tree's tree pass is path-conditioned; mismatched heads are refused."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SpecConfig
from specbench.drafters.heads.jetspec_tree import JetSpecTreeDrafter, rescore_tree
from specbench.drafters.heads.parallel import DFlashDrafter, JetSpecDrafter
from specbench.engine import SpecDecoder, ar_decoder
from specbench.trees.base import DraftTree

from head_helpers import random_head

DRAFTERS = {"dflash": DFlashDrafter, "jetspec": JetSpecDrafter, "jetspec-tree": JetSpecTreeDrafter}
PROMPTS = [[5, 17, 33, 2, 90, 41], [88, 3, 14, 15, 92, 65, 35, 89, 79]]
NEW = 32


@pytest.fixture(scope="module")
def ar_tokens(tiny):
    decoder = ar_decoder(tiny, max_seq_len=160)
    return [decoder.generate(p, NEW).tokens for p in PROMPTS]


@pytest.mark.parametrize("name", list(DRAFTERS))
@pytest.mark.parametrize("tree, budget", [("chain", 4), ("ddtree", 6), ("accum-logp", 12)])
def test_greedy_sd_equals_ar(tiny, trained_tiny_heads, ar_tokens, name: str, tree: str, budget: int) -> None:
    drafter = DRAFTERS[name](tiny, head=trained_tiny_heads[name])
    decoder = SpecDecoder(tiny, SpecConfig(drafter=name, tree=tree, budget=budget), max_seq_len=160, drafter=drafter)
    accepted = 0
    for prompt, want in zip(PROMPTS, ar_tokens):
        result = decoder.generate(prompt, NEW)
        assert result.tokens == want, f"{name}/{tree}/{budget} diverged from AR greedy"
        accepted += sum(r.accepted for r in result.stats.rounds)
    assert accepted > 0, "no draft was ever accepted: the commit paths were not exercised"


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_random_head_greedy_equals_ar(tiny, ar_tokens, name: str) -> None:
    drafter = DRAFTERS[name](tiny, head=random_head(tiny, name, seed=3))
    decoder = SpecDecoder(tiny, SpecConfig(drafter=name, tree="ddtree", budget=10), max_seq_len=160, drafter=drafter)
    assert [decoder.generate(p, NEW).tokens for p in PROMPTS] == ar_tokens


class RecordingDrafter(JetSpecTreeDrafter):
    """Records every context write of the draft cache and the committed length at each draft."""

    def begin(self, state, prefill, max_seq_len):
        self.writes: list[tuple[int, int]] = []
        self.lengths: list[tuple[int, int]] = []
        super().begin(state, prefill, max_seq_len)

    def write_context(self, features, count):
        start = self.context_len
        super().write_context(features, count)
        self.writes.append((start, self.context_len))

    def block_logp(self, state):
        self.lengths.append((self.context_len, state.cache_len))
        return super().block_logp(state)


def test_draft_cache_holds_each_committed_position_once(tiny, trained_tiny_heads) -> None:
    drafter = RecordingDrafter(tiny, head=trained_tiny_heads["jetspec-tree"])
    decoder = SpecDecoder(tiny, SpecConfig(drafter="jetspec-tree", tree="ddtree", budget=8), max_seq_len=160, drafter=drafter)
    prompt = PROMPTS[1]
    result = decoder.generate(prompt, NEW)
    assert sum(r.accepted for r in result.stats.rounds) > 0
    # every draft sees exactly the committed positions (all tokens but the anchor) ...
    assert len(drafter.lengths) == len(result.stats.rounds) and len(drafter.writes) == len(result.stats.rounds) + 1
    assert all(ctx == committed for ctx, committed in drafter.lengths)
    # ... written in contiguous, non-overlapping ranges from 0: each position once
    written = [p for s, e in drafter.writes for p in range(s, e)]
    assert written == list(range(len(written)))
    # the cached K/V equal those computed from one teacher-forced target pass over the same tokens
    seq = torch.tensor([prompt + result.tokens])
    n = drafter.context_len
    full = tiny.forward(seq[:, :n], torch.arange(n)[None], tiny.new_cache(n + 1), None, drafter.taps)
    feats = torch.cat([full.hidden[t] for t in drafter.taps], dim=-1)
    kv = drafter.head.context_kv(feats, torch.arange(n)[None], tiny.model)
    for i, (k, v) in enumerate(kv):
        torch.testing.assert_close(drafter.cache.k[i, :, :, :n], k, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(drafter.cache.v[i, :, :, :n], v, atol=1e-4, rtol=1e-4)


def test_tree_pass_is_path_conditioned(tiny, trained_tiny_heads) -> None:
    """Node u's pass-2 output equals a block pass over u's own path as concrete inputs."""
    from specbench.drafters.base import DraftState
    from specbench.config import SamplingConfig
    from specbench.drafters.heads.masks import block_pattern
    from specbench.verify.base import TorchRandomness

    drafter = JetSpecTreeDrafter(tiny, head=trained_tiny_heads["jetspec-tree"])
    prompt = PROMPTS[0]
    n = len(prompt)
    prefill = tiny.forward(torch.tensor([prompt]), torch.arange(n)[None], tiny.new_cache(64), None, drafter.taps)
    state = DraftState(tokens=prompt + [11], prompt_len=n, sampling=SamplingConfig(), draft_rng=TorchRandomness(0))
    drafter.begin(state, prefill, 64)
    tree = DraftTree.from_paths(11, [[4, 5, 6], [4, 7], [8, 9, 10, 3]])
    node_logp = drafter.path_logp(state, tree)
    for node in range(tree.num_nodes):
        path = tree.path_to(node)
        toks = tree.tokens[path]
        d = len(path)
        solo = drafter.run_block(state, toks, torch.zeros(d, dtype=torch.bool), torch.arange(d),
                                 block_pattern(d, "block-causal"))
        torch.testing.assert_close(node_logp[node], solo[-1], atol=1e-5, rtol=1e-5)


def test_rescore_tree_scores_and_extension() -> None:
    torch.manual_seed(0)
    tree = DraftTree.from_paths(1, [[2, 3], [4]])  # nodes: 0 root, 1 tok2, 2 tok3, 3 tok4
    logp = torch.log_softmax(torch.randn(4, 10), dim=-1)
    out = rescore_tree(tree, logp, extend=2, max_depth=2).validate()
    tokens, parents, depth = out.host
    s = out.scores.tolist()
    assert s[1] == pytest.approx(float(logp[0, 2])) and s[2] == pytest.approx(float(logp[0, 2] + logp[1, 3]))
    assert s[3] == pytest.approx(float(logp[0, 4]))
    assert out.num_nodes == 4 + 4 * 2  # `extend` new leaves per node (static shape), in (node, rank) order
    assert parents[4:] == [0, 0, 1, 1, 2, 2, 3, 3]
    for v in range(4, out.num_nodes):  # new nodes: leaves with path score, not duplicating a child
        p = parents[v]
        if depth[p] >= 2:  # node 2 is at max depth: its leaves can never be chosen
            assert s[v] == float("-inf")
        else:
            assert s[v] == pytest.approx(s[p] + float(logp[p, tokens[v]]))
            assert (p, tokens[v]) not in {(parents[c], tokens[c]) for c in range(1, 4)}
    assert all(s[v] <= s[parents[v]] + 1e-12 for v in range(1, out.num_nodes))


@pytest.mark.parametrize("seed", range(6))
def test_rescore_tree_offers_each_nodes_best_fresh_tokens(seed: int) -> None:
    """The new leaves of node u are its `extend` best tokens, equal values by lower id, skipping u's children;
    a child of the root carrying the root's own token is masked like any other (the root's write is spare)."""
    g = torch.Generator().manual_seed(seed)
    tree = DraftTree.from_paths(3, [[3, 1], [3, 2], [5], [1, 3, 3]])  # the root's child 3 repeats its token
    logp = (torch.randn(tree.num_nodes, 9, generator=g) * 2).round() / 2  # coarse: equal values across ranks
    extend = 3
    out = rescore_tree(tree, logp, extend, max_depth=6)
    tokens, parents, _ = out.host
    n = tree.num_nodes
    for u in range(n):
        children = {tokens[c] for c in range(1, n) if parents[c] == u}
        ranked = sorted(range(9), key=lambda t: (-float(logp[u, t]), t))
        assert tokens[n + u * extend: n + (u + 1) * extend] == [t for t in ranked if t not in children][:extend]


def test_mismatched_heads_are_refused(tiny) -> None:
    with pytest.raises(ValueError, match="bidirectional"):
        JetSpecDrafter(tiny, head=random_head(tiny, "dflash"))
    with pytest.raises(ValueError, match="clean"):
        JetSpecTreeDrafter(tiny, head=random_head(tiny, "jetspec"))
    with pytest.raises(ValueError, match="block_size"):
        DFlashDrafter(tiny, head=random_head(tiny, "dflash"), block_size=99)


def test_missing_default_head_says_how_to_train(tiny) -> None:
    from specbench.drafters.heads.checkpoint import HeadCheckpointError

    with pytest.raises(HeadCheckpointError, match="specbench train --drafter dflash"):
        DFlashDrafter(tiny)


def test_sampled_chain_carries_its_draft_law(tiny) -> None:
    """With rejection sampling at T > 0 the drafter samples a chain and records the law it drew from."""
    from specbench.config import SamplingConfig

    if "chain-rs" not in __import__("specbench.verify", fromlist=["VERIFIERS"]).VERIFIERS:
        pytest.skip("no chain rejection-sampling verifier registered yet")
    drafter = DFlashDrafter(tiny, head=random_head(tiny, "dflash"))
    decoder = SpecDecoder(tiny, SpecConfig(drafter="dflash", verifier="chain-rs", budget=4), max_seq_len=96, drafter=drafter)
    result = decoder.generate(PROMPTS[0], 16, SamplingConfig(temperature=1.0, seed=1))
    assert len(result.tokens) == 16


@pytest.mark.parametrize("name", ["jetspec", "jetspec-tree", "dflash"])
def test_a_shorter_drafting_block(tiny, trained_tiny_heads, name: str) -> None:
    """drafter_args block_size below the trained block: a block-causal head's marginals at the depths the
    shorter block keeps are the full block's exactly (so it is the same head with its depth capped, as
    docs/training_at_scale.md's "Block size" compares); a bidirectional head's move, since every MASK
    position sees the whole block. Greedy SD stays AR, at most block - 1 drafted tokens accepted a round."""
    from specbench.config import SamplingConfig
    from specbench.drafters.base import DraftState
    from specbench.verify.base import TorchRandomness

    head = trained_tiny_heads[name]
    assert DRAFTERS[name](tiny, head=head).block_size == head.config.block_size == 6
    with pytest.raises(ValueError, match=r"block_size must be in \[2, 6\]"):
        DRAFTERS[name](tiny, head=head, block_size=7)
    prompt = PROMPTS[1]
    n = len(prompt)
    marginals = []
    for block in (6, 3):
        drafter = DRAFTERS[name](tiny, head=head, block_size=block)
        prefill = tiny.forward(torch.tensor([prompt]), torch.arange(n)[None], tiny.new_cache(64), None, drafter.taps)
        state = DraftState(tokens=prompt + [11], prompt_len=n, sampling=SamplingConfig(), draft_rng=TorchRandomness(0))
        drafter.begin(state, prefill, 64)
        marginals.append(drafter.block_logp(state))  # [D, V]
    full, cut = marginals
    assert full.shape[0] == 5 and cut.shape[0] == 2
    if name == "dflash":
        assert not torch.allclose(full[:2], cut, atol=1e-4)
    else:
        torch.testing.assert_close(full[:2], cut, atol=1e-5, rtol=1e-5)
    decoder = SpecDecoder(tiny, SpecConfig(drafter=name, tree="ddtree", budget=8), max_seq_len=160,
                          drafter=DRAFTERS[name](tiny, head=head, block_size=3))
    result = decoder.generate(prompt, NEW)
    assert result.tokens == ar_decoder(tiny, max_seq_len=160).generate(prompt, NEW).tokens
    assert max(r.accepted for r in result.stats.rounds) <= 2
