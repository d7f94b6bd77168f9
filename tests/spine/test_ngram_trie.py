"""The n-gram drafter's lookup and trie. `match_trie` equals the trie `DraftTree.from_paths` builds
(node order, tokens, parents, depths; each node scored log(fraction of the continuations through it))
with padding after the real nodes; `match_starts` finds what a plain loop finds; and the device path
(history buffer extended by `observe`, padded trie, the policy's tensor select) drafts, node for node,
the host path's tree, round after round, on random and repetitive histories."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specbench.drafters.ngram import NgramDrafter, match_starts, match_trie
from specbench.trees import TREE_POLICIES
from specbench.trees.base import DraftTree

from ngram_rounds import CpuTarget, state_of, check_device_rounds


def _counts(tree: DraftTree, conts: list[list[int]]) -> list[int]:
    tokens, parents, _ = tree.host
    child = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens)) if p >= 0}
    counts = [len(conts)] + [0] * (tree.num_nodes - 1)
    for c in conts:
        node = 0
        for tok in c:
            node = child[(node, tok)]
            counts[node] += 1
    return counts


def _table(conts: list[list[int]], rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    table = torch.full((rows, width), 3, dtype=torch.long)  # junk past the valid entries must not matter
    valid = torch.zeros(rows, width, dtype=torch.bool)
    for i, c in enumerate(conts):
        table[i, : len(c)], valid[i, : len(c)] = torch.tensor(c), True
    return table, valid


def test_match_trie_equals_from_paths_with_match_fractions_then_padding() -> None:
    rng = np.random.default_rng(1)
    for trial in range(200):
        conts = [rng.integers(0, 3, rng.integers(1, 7)).tolist() for _ in range(rng.integers(1, 9))]
        rows, width = len(conts) + int(rng.integers(0, 3)), 6 + int(rng.integers(0, 3))
        got, count = match_trie(7, *_table(conts, rows, width))
        ref = DraftTree.from_paths(7, conts)
        k = ref.num_nodes
        assert int(count) == k - 1 and got.num_nodes == 1 + rows * width, trial
        tokens, parents, depth = got.host
        assert (tokens[:k], parents[:k], depth[:k]) == ref.host, trial
        assert parents[k:] == [-1] * (got.num_nodes - k) and depth[k:] == [0] * (got.num_nodes - k), trial
        want = [math.log(c / len(conts)) for c in _counts(ref, conts)]
        assert np.allclose(got.scores[:k].numpy(), want) and bool(torch.isneginf(got.scores[k:]).all()), trial


def _starts_by_loop(tokens: list[int], max_ngram: int, min_ngram: int, max_matches: int) -> list[int]:
    """Continuation starts of the longest suffix n-gram (n <= len - 1) found earlier, most recent first."""
    total = len(tokens)
    for n in range(min(max_ngram, total - 1), min_ngram - 1, -1):
        found = [s + n for s in range(total - n - 1, -1, -1) if tokens[s: s + n] == tokens[total - n:]]
        if found:
            return found[:max_matches]
    return []


def test_match_starts_equal_a_loop_over_windows() -> None:
    rng = np.random.default_rng(2)
    for trial in range(400):
        tokens = rng.integers(0, int(rng.integers(1, 5)), int(rng.integers(1, 30))).tolist()
        max_ngram = int(rng.integers(1, 5))
        min_ngram, max_matches = int(rng.integers(1, max_ngram + 1)), int(rng.integers(1, 9))
        history = torch.tensor(tokens + [0] * int(rng.integers(0, 10)))  # slots past the length are junk
        got = match_starts(history, torch.tensor([len(tokens)]), max_ngram, min_ngram, max_matches).tolist()
        want = _starts_by_loop(tokens, max_ngram, min_ngram, max_matches)
        assert got == want + [-1] * (max_matches - len(want)), trial


@pytest.mark.parametrize("tree", ["chain", "ddtree-vec"])
def test_device_path_drafts_the_host_tree_round_after_round(tree: str) -> None:
    """Random and repetitive histories, n-gram ranges, match caps and budgets (smaller and larger than
    the trie: ties of equal fractions, matches near the end, no match = root only); the device drafter
    extends its history from each round's Acceptance and drafts without a host read."""
    assert check_device_rounds(torch.device("cpu"), tree, trials=40) > 40  # rounds that drafted a match


def test_host_path_under_every_policy_needs_no_device_state() -> None:
    """No match: the root alone; under `static` (a host select) the device drafter drafts on the host."""
    drafter = NgramDrafter(CpuTarget(), on_device=True)  # type: ignore[arg-type]
    static = TREE_POLICIES.build("static", tree="default-31")
    assert not drafter.capturable(static)
    assert drafter.draft(state_of([1, 2, 3, 4]), static, 8).host == ([4], [-1], [0])
    tree = drafter.draft(state_of([1, 2, 3, 1, 2, 3, 1, 2]), static, 8)
    assert tree.host[0] == [2, 3, 1, 2]


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("tree", ["chain", "ddtree-vec"])
def test_greedy_sd_with_the_device_drafter_is_ar_and_accepts_what_the_host_one_does(tree: str) -> None:
    """fp32 on the CPU: the device path (on_device=True) emits the AR tokens and accepts, round by round,
    what the host path accepts, in decoding and in exact replay (whose observe gets a host result)."""
    from specbench.drafters.base import TeacherForced
    from specbench.engine import SpecDecoder
    from specbench.config import SpecConfig
    from targets import tiny_target

    target = tiny_target(num_layers=2, seed=3)
    prompts = [[5, 17, 33, 2, 90, 41, 5, 17, 33], [88, 3, 14, 15, 92, 65, 35, 89, 79, 3, 14, 15]]
    ar = SpecDecoder(target, SpecConfig(), max_seq_len=128)
    for budget in (1, 6, 16):
        spec = SpecConfig(drafter="ngram", tree=tree, budget=budget)
        host = SpecDecoder(target, spec, max_seq_len=128, drafter=NgramDrafter(target, on_device=False))
        device = SpecDecoder(target, spec, max_seq_len=128, drafter=NgramDrafter(target, on_device=True))
        assert device.device_drafting and not host.device_drafting
        accepted = 0
        for prompt in prompts:
            want = ar.generate(prompt, 24).tokens
            a, b = host.generate(prompt, 24), device.generate(prompt, 24)
            assert a.tokens == b.tokens == want, (budget, prompt)
            rounds = [r.accepted for r in a.stats.rounds]
            assert [r.accepted for r in b.stats.rounds] == rounds, (budget, prompt)
            reference = TeacherForced(tokens=prompt + want, hidden={})  # its last round may stop at the end
            replays = [d.generate(prompt, 24, reference=reference) for d in (host, device)]
            assert replays[0].tokens == replays[1].tokens == want, (budget, prompt)
            assert [r.accepted for r in replays[0].stats.rounds] == [r.accepted for r in replays[1].stats.rounds]
            accepted += sum(rounds)
        assert accepted > 0, "the prompts are meant to repeat: drafts must get accepted"


@pytest.mark.usefixtures("single_thread")
def test_sampled_rounds_draft_the_host_tree_for_the_host_verifier() -> None:
    """At T > 0 a host verifier decides the round: the device drafter hands it the host path's tree (real
    nodes only), so the same seed gives the same tokens and acceptances as the host drafter."""
    from specbench.config import SamplingConfig, SpecConfig
    from specbench.engine import SpecDecoder
    from targets import tiny_target

    target = tiny_target(num_layers=2, seed=3)
    prompt = [88, 3, 14, 15, 92, 65, 35, 89, 79, 3, 14, 15]
    runs = []
    for on_device in (False, True):
        spec = SpecConfig(drafter="ngram", tree="chain", budget=6, verifier="sample-walk")
        decoder = SpecDecoder(target, spec, max_seq_len=128, drafter=NgramDrafter(target, on_device=on_device))
        res = decoder.generate(prompt, 24, SamplingConfig(temperature=0.7, seed=3))
        runs.append((res.tokens, [(r.accepted, r.tree_size) for r in res.stats.rounds]))
    assert runs[0] == runs[1]
