"""The replay evaluator gives exactly the real decode loop's rounds (fp32): same accepted count in
every round, hence the same tau, for ngram, self and every DFlash-family head."""

from __future__ import annotations

import pytest

from specbench.bench.replay import HeadProposals, build_references, replay, replay_drafter, walk
from specbench.config import SpecConfig
from specbench.drafters import DRAFTERS
from specbench.drafters.heads.jetspec_tree import JetSpecTreeDrafter
from specbench.drafters.heads.parallel import DFlashDrafter, JetSpecDrafter
from specbench.engine import SpecDecoder
from specbench.trees import TREE_POLICIES
from specbench.trees.base import DraftTree

from head_helpers import random_head

HEADS = {"dflash": DFlashDrafter, "jetspec": JetSpecDrafter, "jetspec-tree": JetSpecTreeDrafter}
PROMPTS = [[5, 17, 33, 2, 90, 41], [88, 3, 14, 15, 92, 65, 35, 89, 79]]
NEW = 40


def sd_rounds(target, name, drafter, tree, budget, prompt, new=NEW):
    decoder = SpecDecoder(target, SpecConfig(drafter=name, tree=tree, budget=budget), max_seq_len=256, drafter=drafter)
    result = decoder.generate(prompt, new)
    return [r.accepted for r in result.stats.rounds], result.tokens


@pytest.fixture(scope="module")
def refs(tiny):
    return build_references(tiny, PROMPTS, NEW, taps=range(tiny.config.num_layers), batch_size=1)


@pytest.mark.parametrize("name, tree, budget", [("dflash", "ddtree", 8), ("jetspec", "accum-logp", 12),
                                                ("jetspec-tree", "ddtree", 8), ("jetspec-tree", "chain", 4)])
def test_head_replay_equals_decoding(tiny, trained_tiny_heads, refs, name, tree, budget) -> None:
    policy = TREE_POLICIES.build(tree)
    accepted = 0
    for prompt, ref in zip(PROMPTS, refs):
        drafter = HEADS[name](tiny, head=trained_tiny_heads[name])
        fast = replay(drafter, ref, policy, budget, NEW, proposals=HeadProposals(drafter, ref, top_k=16))
        slow = replay_drafter(HEADS[name](tiny, head=trained_tiny_heads[name]), ref, policy, budget, NEW)
        rounds, tokens = sd_rounds(tiny, name, HEADS[name](tiny, head=trained_tiny_heads[name]), tree, budget, prompt)
        assert fast.accepted == rounds and slow.accepted == rounds, f"{name}/{tree}/{budget}"
        assert fast.output == tokens and ref.tf_mismatch == 0
        accepted += sum(rounds)
    assert accepted > 0


@pytest.mark.parametrize("name, args, tree, budget", [("ngram", {}, "ddtree", 8), ("self", {"layers": 1}, "chain", 5),
                                                     ("self", {"layers": 2}, "chain", 12)])
def test_generic_replay_equals_decoding(tiny, refs, name, args, tree, budget) -> None:
    policy = TREE_POLICIES.build(tree)
    for prompt, ref in zip(PROMPTS, refs):
        got = replay(DRAFTERS.build(name, tiny, **args), ref, policy, budget, NEW)  # self/chain: the fast path
        generic = replay_drafter(DRAFTERS.build(name, tiny, **args), ref, policy, budget, NEW)
        rounds, _ = sd_rounds(tiny, name, DRAFTERS.build(name, tiny, **args), tree, budget, prompt)
        assert got.accepted == rounds and generic.accepted == rounds


def test_walk_follows_the_reference() -> None:
    tree = DraftTree.from_paths(1, [[2, 3, 4], [2, 5], [6]])
    assert walk(tree, [9, 1, 2, 5, 7], 2) == ([0, 1, 4], False)
    assert walk(tree, [9, 1, 6], 2) == ([0, 5], False)
    assert walk(tree, [9, 1, 2, 3], 2) == ([0, 1, 2], True)  # ran off the reference below node 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ngram", "self", "dflash", "jetspec", "jetspec-tree"])
def test_replay_equals_decoding_on_smollm2(smollm2, name) -> None:
    """Real target, random heads (for equality any head will do), a few prompts."""
    texts = ["What is 17 times 23? Explain.", "Write a Python function that reverses a list.",
             "Name three rivers in Europe."]
    prompts = [smollm2.encode_chat(t) for t in texts]

    def make():
        if name in HEADS:
            return HEADS[name](smollm2, head=random_head(smollm2, name, num_layers=1, taps=(1, 14, 27), block_size=8))
        return DRAFTERS.build(name, smollm2, **({"layers": 4} if name == "self" else {}))

    probe = make()
    refs = build_references(smollm2, prompts, 48, taps=probe.taps, batch_size=1)
    tree, budget = ("chain", 6) if name == "self" else ("ddtree", 16)
    for prompt, ref in zip(prompts, refs):
        got = replay(make(), ref, TREE_POLICIES.build(tree), budget, 48)
        rounds, tokens = sd_rounds(smollm2, name, make(), tree, budget, prompt, new=48)
        assert got.output == tokens
        assert got.accepted == rounds, f"{name}: replay {got.accepted} vs decoding {rounds} (tf mismatches {ref.tf_mismatch})"
