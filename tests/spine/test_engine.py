"""Decode-loop behaviour: exact stops (EOS, max_new_tokens), stats, and bad input failing at once."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specbench.config import ConfigError, SamplingConfig, SpecConfig
from specbench.drafters.base import Drafter, DraftState
from specbench.engine import NonFiniteLogitsError, SpecDecoder, all_finite
from specbench.models import load_target
from specbench.models.loader import ModelLoadError
from specbench.trees import TREE_POLICIES
from specbench.trees.base import DraftTree, TreePolicy


class OracleDrafter(Drafter):
    """Proposes the known AR continuation (so everything is accepted), plus a wrong sibling branch."""

    policies, taps, weights = "any", (), None

    def __init__(self, target, continuation: list[int]) -> None:
        super().__init__(target)
        self.continuation = continuation

    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        done = len(state.tokens) - state.prompt_len  # generated so far (the anchor included)
        good = self.continuation[done: done + budget - 1]
        wrong = (good[0] + 1) % self.target.config.vocab_size if good else None
        paths = [good] + ([[wrong]] if wrong is not None else [])
        return DraftTree.from_paths(state.anchor, paths, device=self.target.device)


@pytest.fixture(scope="module")
def tiny():
    return load_target("random:tiny-llama@7")


def _ar(target, prompt, n):
    return SpecDecoder(target, SpecConfig(), max_seq_len=128).generate(prompt, n).tokens


def test_max_new_tokens_is_exact(tiny) -> None:
    prompt = [3, 14, 15, 92, 65]
    ar = _ar(tiny, prompt, 40)
    for n in (1, 2, 7, 13):
        dec = SpecDecoder(tiny, SpecConfig(budget=8), drafter=OracleDrafter(tiny, ar), max_seq_len=128)
        res = dec.generate(prompt, n)
        assert res.tokens == ar[:n]
        assert res.stats.new_tokens == n and res.stats.stop_reason == "length"
    assert max(r.accepted for r in res.stats.rounds) == 7  # budget 8 = 7 good + 1 wrong sibling


def test_stops_exactly_at_eos_inside_an_accepted_block(tiny) -> None:
    prompt = [1, 2, 3, 4]
    ar = _ar(tiny, prompt, 40)
    k = 9  # make the 10th generated token the EOS
    target = dataclasses.replace(tiny, eos_token_ids=(ar[k],))
    first = ar.index(ar[k])
    dec = SpecDecoder(target, SpecConfig(budget=6), drafter=OracleDrafter(target, ar), max_seq_len=128)
    res = dec.generate(prompt, 40)
    assert res.tokens == ar[: first + 1] and res.stats.stop_reason == "eos"


def test_stats_count_tau_with_bonus(tiny) -> None:
    prompt = [5, 6, 7]
    ar = _ar(tiny, prompt, 30)
    res = SpecDecoder(tiny, SpecConfig(budget=4), drafter=OracleDrafter(tiny, ar), max_seq_len=128).generate(prompt, 30)
    assert res.stats.rounds and all(r.tree_size == 4 for r in res.stats.rounds[:-1])
    assert res.stats.tau == pytest.approx(sum(r.accepted + 1 for r in res.stats.rounds) / len(res.stats.rounds))
    assert res.stats.tau > 3.5  # 3 of 4 draft nodes are on the right path
    ar_stats = SpecDecoder(tiny, SpecConfig(), max_seq_len=128).generate(prompt, 30).stats
    assert ar_stats.tau == 1.0 and len(ar_stats.rounds) == 29


def test_prompt_over_context_fails_before_any_work(tiny) -> None:
    dec = SpecDecoder(tiny, SpecConfig(drafter="ngram", budget=8), max_seq_len=64)
    with pytest.raises(ConfigError, match="exceeds the 64-token context"):
        dec.generate(list(range(50)), 10)
    with pytest.raises(ConfigError, match="empty"):
        dec.generate([], 10)
    with pytest.raises(ConfigError, match="token ids"):
        dec.generate([10_000], 3)
    with pytest.raises(ConfigError, match="max_seq_len"):
        SpecDecoder(tiny, SpecConfig(), max_seq_len=100_000)


def test_greedy_verifier_refuses_sampling(tiny) -> None:
    dec = SpecDecoder(tiny, SpecConfig(verifier="greedy"), max_seq_len=64)
    with pytest.raises(ValueError, match="temperature 0"):
        dec.generate([1, 2], 4, SamplingConfig(temperature=0.8))


def test_a_drafter_refuses_a_policy_it_cannot_use(tiny) -> None:
    """ngram selects from a scored trie: chain, ddtree (top-B) and static templates apply; eagle2's beams
    and fan-out caps need per-depth scores, so they are refused with the list, not ignored."""
    with pytest.raises(ConfigError, match=r"drafter 'ngram' cannot draft with tree='eagle2'; the policies it can: "
                                          r"chain, ddtree, ddtree-vec, static") as refused:
        SpecDecoder(tiny, SpecConfig(drafter="ngram", tree="eagle2"), max_seq_len=64)
    assert refused.value.keys == ("tree",)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    ar = _ar(tiny, prompt, 12)
    for tree, args in (("chain", {}), ("ddtree", {}), ("static", {"tree": "default-31"})):
        spec = SpecConfig(drafter="ngram", tree=tree, tree_args=args, budget=4)
        assert SpecDecoder(tiny, spec, max_seq_len=128).generate(prompt, 12).tokens == ar


def test_sampled_parallel_drafts_need_chain_and_say_which_verifier_keeps_a_tree() -> None:
    from specbench.drafters import DRAFTERS

    dflash = DRAFTERS.get("dflash")
    dflash.check_policy("ddtree")  # deterministic trees: any policy
    dflash.check_policy("chain", sampled=True)
    with pytest.raises(ConfigError, match=r"the policies it can then: chain\. To keep that policy, verify with "
                                          r"verifier=sample-walk or verifier=tree-rrs-pointmass"):
        dflash.check_policy("ddtree", sampled=True)


def test_lossy_verifier_is_refused_unless_allowed(tiny) -> None:
    from specbench.verify.walk import SampleWalk

    class Lossy(SampleWalk):
        lossless = False

    with pytest.raises(ConfigError, match="not lossless"):
        SpecDecoder(tiny, SpecConfig(), verifier=Lossy())
    SpecDecoder(tiny, SpecConfig(allow_lossy=True), verifier=Lossy(), max_seq_len=64).generate([1, 2], 3,
                                                                                              SamplingConfig(temperature=1.0))


def test_nan_logits_name_the_round(tiny) -> None:
    target = load_target("random:tiny-llama@7")
    calls = {"n": 0}
    real_forward = target.model.forward

    def poisoned(*args, **kwargs):
        out = real_forward(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 3:  # prefill, round 1, round 2 <- NaN here
            out.logits[..., 0] = float("nan")
        return out

    target.model.forward = poisoned  # test-local instance patch
    with pytest.raises(NonFiniteLogitsError, match="round 2"):
        SpecDecoder(target, SpecConfig(), max_seq_len=64).generate([1, 2, 3], 10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_finite_flags_any_nan_or_inf(dtype) -> None:
    logits = torch.randn(1, 5, 300).mul(30).to(dtype)
    assert bool(all_finite(logits))
    for bad in (float("nan"), float("inf"), -float("inf")):
        poisoned = logits.clone()
        poisoned[0, 3, 17] = bad
        assert not bool(all_finite(poisoned)), bad
    both = logits.clone()
    both[0, 0, 0], both[0, 1, 1] = float("inf"), -float("inf")  # inf - inf is NaN: still flagged
    assert not bool(all_finite(both))


def test_missing_gguf_and_bad_checksum(tmp_path, monkeypatch) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_target(f"gguf:{tmp_path / 'missing.gguf'}")
    bad = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    bad.write_bytes(b"not a gguf")
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))  # no dequantized copy to fall back on
    monkeypatch.setenv("SPECBENCH_SMOLLM2_GGUF", str(bad))
    with pytest.raises(ModelLoadError, match="fails its checksum"):
        load_target("smollm2-135m")


def test_unknown_component_names(tiny) -> None:
    from specbench.registry import RegistryError

    with pytest.raises(RegistryError, match="unknown drafter 'nope'"):
        SpecDecoder(tiny, SpecConfig(drafter="nope"))
    with pytest.raises(RegistryError, match="unknown tree policy"):
        SpecDecoder(tiny, SpecConfig(tree="nope"))
    with pytest.raises(RegistryError, match="unknown verifier"):
        SpecDecoder(tiny, SpecConfig(verifier="nope"))
    with pytest.raises(ModelLoadError, match="unknown random preset"):
        load_target("random:nope")


def test_same_seed_same_output_other_seed_other_output(tiny) -> None:
    dec = SpecDecoder(tiny, SpecConfig(drafter="ngram", verifier="sample-walk", budget=4), max_seq_len=128)
    a = dec.generate([1, 2, 3], 30, SamplingConfig(temperature=1.0, seed=1)).tokens
    b = dec.generate([1, 2, 3], 30, SamplingConfig(temperature=1.0, seed=1)).tokens
    c = dec.generate([1, 2, 3], 30, SamplingConfig(temperature=1.0, seed=2)).tokens
    assert a == b and a != c


def test_taps_are_requested_from_every_forward(tiny) -> None:
    seen = []

    class TapDrafter(Drafter):
        policies, weights = "any", None

        @property
        def taps(self):
            return (0, 1)

        def begin(self, state, prefill, max_seq_len):
            seen.append(("prefill", tuple(sorted(prefill.hidden)), prefill.hidden[1].shape[1]))

        def draft(self, state, policy, budget):
            return DraftTree.chain(state.anchor, [1, 2][:budget])

        def observe(self, tree, result, target_out):
            seen.append(("round", tuple(sorted(target_out.hidden)), target_out.hidden[0].shape[1]))

    SpecDecoder(tiny, SpecConfig(budget=2), drafter=TapDrafter(tiny), max_seq_len=64).generate([4, 5, 6, 7], 5)
    assert seen[0] == ("prefill", (0, 1), 4)
    assert all(s == ("round", (0, 1), 3) for s in seen[1:]) and len(seen) > 1
    assert torch.is_tensor(tiny.model.embed.weight)


def test_timed_policy_charges_growth_to_tree_and_expansion_to_draft() -> None:
    """The engine's wrapper times a policy's `grow` as "tree", minus the drafter's `expand` passes it
    calls back (those stay in the surrounding "draft" stage)."""
    import time

    from specbench.engine import TimedPolicy
    from specbench.stats import RoundClock

    class SlowGrowth(TreePolicy):
        name, can_grow = "slow-growth", True

        def build(self, scores, budget):
            raise AssertionError

        def grow(self, anchor, expand, budget, max_depth, device="cpu"):
            time.sleep(0.05)
            expand(DraftTree.root_only(anchor), torch.zeros(1, dtype=torch.long))
            return DraftTree.root_only(anchor)

    def expand(tree, frontier):
        time.sleep(0.3)
        return torch.zeros(1, 4)

    clock = RoundClock(cuda=False)
    policy = TimedPolicy(SlowGrowth(), clock)
    assert policy.can_grow and not TimedPolicy(TREE_POLICIES.build("ddtree"), clock).can_grow
    clock.begin_request()
    clock.start_round()
    clock.switch("draft")
    policy.grow(3, expand, 1, 1)
    clock.close()
    times = clock.times(0)
    assert 0.05 <= times["tree"] < 0.3 and times["draft"] >= 0.3


def test_a_drafter_is_refused_a_policy_it_does_not_declare(tiny) -> None:
    """`self` declares policies = "growing": the engine names the policies that can grow."""
    with pytest.raises(ConfigError, match=r"cannot draft with tree='ddtree'; the policies it can: chain, eagle2, static"):
        SpecDecoder(tiny, SpecConfig(drafter="self", tree="ddtree"), max_seq_len=64)
