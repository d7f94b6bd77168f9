"""Exact replay (the engine's reference mode) gives exactly the real decode loop's rounds (fp32): the same
accepted count in every round, hence the same tau, when the reference is the AR greedy output — for every
registered drafter under each policy it declares, with trained tiny heads (drafts accepted), with one
drafter replaying several references and budgets in turn (its per-reference precomputation), and on
SmolLM2 (slow)."""

from __future__ import annotations

import pytest
from components import drafter_cases

from specbench.bench.replay import build_references, replay, replay_decoder
from specbench.config import ConfigError, SamplingConfig, SpecConfig
from specbench.drafters import DRAFTERS
from specbench.drafters.heads.jetspec_tree import JetSpecTreeDrafter
from specbench.drafters.heads.parallel import DFlashDrafter, JetSpecDrafter
from specbench.engine import SpecDecoder
from specbench.trees import TREE_POLICIES

from head_helpers import random_head

pytestmark = pytest.mark.usefixtures("single_thread")

HEADS = {"dflash": DFlashDrafter, "jetspec": JetSpecDrafter, "jetspec-tree": JetSpecTreeDrafter}
PROMPTS = [[5, 17, 33, 2, 90, 41], [88, 3, 14, 15, 92, 65, 35, 89, 79]]
NEW = 40
CASES = drafter_cases()


def sd_rounds(target, drafter, tree, budget, prompt, new=NEW, tree_args=None):
    spec = SpecConfig(drafter=drafter.name, tree=tree, tree_args=tree_args or {}, budget=budget)
    result = SpecDecoder(target, spec, max_seq_len=256, drafter=drafter).generate(prompt, new)
    return [r.accepted for r in result.stats.rounds], result.tokens


def build(name, target, **args):
    extra = {"random_init": True} if DRAFTERS.get(name).weights is not None else {}
    return DRAFTERS.build(name, target, **extra, **args)


@pytest.fixture(scope="module")
def refs(tiny):
    return build_references(tiny, PROMPTS, NEW, taps=range(tiny.config.num_layers), batch_size=1)


@pytest.mark.parametrize("budget", [3, 16])
@pytest.mark.parametrize("name,tree,tree_args", CASES, ids=[f"{d}-{t}{a or ''}" for d, t, a in CASES])
def test_replay_equals_decoding_for_every_drafter(tiny, refs, name, tree, tree_args, budget) -> None:
    policy = TREE_POLICIES.build(tree, **tree_args)
    for prompt, ref in zip(PROMPTS, refs):
        assert ref.tf_mismatch == 0
        got = replay(build(name, tiny), ref, policy, budget, NEW)
        rounds, tokens = sd_rounds(tiny, build(name, tiny), tree, budget, prompt, tree_args=tree_args)
        assert got.accepted == rounds, f"{name}/{tree}/{budget}: replay {got.accepted} vs decoding {rounds}"
        assert got.output == tokens


@pytest.mark.parametrize("name, tree, budget", [("dflash", "ddtree", 8), ("dflash", "chain", 5),
                                                ("jetspec", "accum-logp", 12), ("jetspec-tree", "ddtree", 8),
                                                ("jetspec-tree", "chain", 4)])
def test_trained_head_replay_equals_decoding(tiny, trained_tiny_heads, refs, name, tree, budget) -> None:
    """Trained heads get drafts accepted, so the rounds commit paths (and jetspec-tree's pass 2 reads
    the context the rounds wrote)."""
    policy = TREE_POLICIES.build(tree)
    accepted = 0
    for prompt, ref in zip(PROMPTS, refs):
        got = replay(HEADS[name](tiny, head=trained_tiny_heads[name]), ref, policy, budget, NEW)
        rounds, tokens = sd_rounds(tiny, HEADS[name](tiny, head=trained_tiny_heads[name]), tree, budget, prompt)
        assert got.accepted == rounds and got.output == tokens, f"{name}/{tree}/{budget}"
        accepted += sum(rounds)
    assert accepted > 0


@pytest.mark.parametrize("name", ["jetspec-tree", "self"])
def test_one_drafter_replays_references_and_budgets_in_turn(tiny, trained_tiny_heads, refs, name) -> None:
    """A drafter's precomputation along a reference is redone for the next reference and for a budget
    that reads more of it: replaying in turn gives what fresh drafters give."""
    def make():
        return HEADS[name](tiny, head=trained_tiny_heads[name]) if name in HEADS else DRAFTERS.build("self", tiny, layers=1)

    tree = "ddtree" if name in HEADS else "chain"
    policy, shared = TREE_POLICIES.build(tree), make()
    for ref in [refs[0], refs[1], refs[0]]:
        for budget in (2, 9, 4):
            want = replay(make(), ref, policy, budget, NEW)
            assert replay(shared, ref, policy, budget, NEW).accepted == want.accepted


def test_decoder_is_reused_across_references(tiny, refs) -> None:
    drafter, policy = DRAFTERS.build("ngram", tiny), TREE_POLICIES.build("ddtree")
    decoder = replay_decoder(drafter, policy, 8)
    for ref in refs:
        assert replay(drafter, ref, policy, 8, NEW, decoder=decoder).accepted == replay(
            DRAFTERS.build("ngram", tiny), ref, policy, 8, NEW).accepted
    with pytest.raises(ValueError, match="another drafter, policy or budget"):
        replay(drafter, refs[0], policy, 4, NEW, decoder=decoder)


def test_reference_runs_past_its_end(tiny) -> None:
    """A reference with no tokens past the stop: rounds whose walk reaches its end are counted, and the
    output is still the reference's."""
    ref = build_references(tiny, PROMPTS[:1], NEW, taps=(), extra=0)[0]
    drafter = DRAFTERS.build("self", tiny, layers=tiny.config.num_layers)  # the target itself: every draft accepted
    got = replay(drafter, ref, TREE_POLICIES.build("eagle2"), 12, NEW)
    assert got.output == ref.tokens[: ref.output_len]
    assert got.ref_exhausted == 1  # the last round's tree grows past the end of the reference


def test_reference_mode_needs_greedy(tiny, refs) -> None:
    decoder = SpecDecoder(tiny, SpecConfig(drafter="ngram", verifier="sample-walk"), max_seq_len=256)
    with pytest.raises(ConfigError, match="temperature 0"):
        decoder.generate(PROMPTS[0], NEW, SamplingConfig(temperature=1.0), reference=refs[0].forced)
    with pytest.raises(ConfigError, match="the prompt followed by"):
        SpecDecoder(tiny, SpecConfig(drafter="ngram"), max_seq_len=256).generate(PROMPTS[1], NEW, reference=refs[0].forced)


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
        rounds, tokens = sd_rounds(smollm2, make(), tree, budget, prompt, new=48)
        assert got.output == tokens
        assert got.accepted == rounds, f"{name}: replay {got.accepted} vs decoding {rounds} (tf mismatches {ref.tf_mismatch})"
