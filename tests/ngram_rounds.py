"""The n-gram drafter's device path against its host path, round after round (shared by the CPU test and
the GPU one): the device drafter extends its history from each round's `Acceptance` and must draft,
without a host read, the host path's tree node for node (then padding)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specbench.config import SamplingConfig
from specbench.drafters.base import DraftState
from specbench.drafters.ngram import NgramDrafter
from specbench.models.decoder import ForwardOutput
from specbench.trees import TREE_POLICIES
from specbench.trees.base import DraftTree
from specbench.verify.base import Acceptance, TorchRandomness

from host_reads import no_host_reads


@dataclass
class CpuTarget:
    """What the n-gram drafter reads of a target: its device."""

    device: torch.device = torch.device("cpu")


def state_of(tokens: list[int]) -> DraftState:
    return DraftState(tokens=list(tokens), prompt_len=1, sampling=SamplingConfig(), draft_rng=TorchRandomness(0))


def run_phases(phases) -> DraftTree:  # type: ignore[no-untyped-def]
    x = None
    for _, step in phases:
        x = step(x)
    return x


def real_part(tree: DraftTree) -> tuple[list[int], list[int], list[int]]:
    """The tree without its padding (parentless non-root nodes, all after the real ones)."""
    tokens, parents, depth = tree.host
    k = next((i for i in range(1, len(parents)) if parents[i] < 0), len(parents))
    assert all(p < 0 for p in parents[k:]), "padding must follow the real nodes"
    return tokens[:k], parents[:k], depth[:k]


def accept_some(tree: DraftTree, rng: np.random.Generator, vocab: int) -> Acceptance:
    """A random root path of the tree's real part and a bonus token, packed as the verifier packs it."""
    _, parents, _ = real_part(tree)
    path = [0]
    while rng.random() < 0.7:
        kids = [i for i in range(len(parents)) if parents[i] == path[-1]]
        if not kids:
            break
        path.append(int(rng.choice(kids)))
    row = [len(path), int(rng.integers(0, vocab)), *path] + [-1] * (tree.num_nodes - len(path))
    return Acceptance(torch.tensor(row, device=tree.device))


def check_device_rounds(device: torch.device, tree: str, trials: int, seed: int = 3, kernel: bool | None = None) -> int:
    """Random and repetitive histories (vocabularies of 1-5 tokens, a repeated span: tied matches; 50:
    mostly no match = the root alone), n-gram ranges, match caps and budgets (smaller and larger than the
    trie), up to 8 rounds each: the device drafter on `device` drafts the host path's tree (same nodes,
    same order, same scores), padded to 1 + budget nodes. Returns the rounds compared whose tree had a draft
    node (a match), so a caller can see that the comparison was not of root-only trees. kernel: the drafter's
    `kernel` argument (None: its default, the Triton kernel on CUDA)."""
    policy = TREE_POLICIES.build(tree)
    drafted = 0
    rng = np.random.default_rng(seed)
    for trial in range(trials):
        vocab = int(rng.integers(1, 6)) if trial % 3 else 50
        max_ngram = int(rng.integers(1, 5))
        args = dict(max_ngram=max_ngram, min_ngram=int(rng.integers(1, max_ngram + 1)),
                    max_matches=int(rng.integers(1, 9)))
        budget = int(rng.integers(1, 12))
        tokens = rng.integers(0, vocab, int(rng.integers(1, 20))).tolist()
        if trial % 4 == 0:
            tokens = (tokens[:4] * 6)[: len(tokens) + 8]
        host = NgramDrafter(CpuTarget(), **args, on_device=False)  # type: ignore[arg-type]
        on_device = NgramDrafter(CpuTarget(device), **args, on_device=True, kernel=kernel)  # type: ignore[arg-type]
        assert on_device.capturable(policy) and not host.capturable(policy)
        state = state_of(tokens)
        on_device.begin(state, ForwardOutput(logits=torch.empty(0), hidden={}), 80)
        for round_no in range(8):
            want = host.draft(state_of(state.tokens), policy, budget)
            with no_host_reads():
                got = run_phases(on_device.phases(state, policy, budget))
            where = (trial, round_no, state.tokens)
            assert got.num_nodes == 1 + budget and got.device.type == device.type, where
            assert real_part(got) == want.host, where
            drafted += want.num_nodes > 1
            if want.scores is not None:  # the same float64 log on the CPU; within rounding elsewhere
                got_scores = got.scores[: want.num_nodes].cpu()
                assert torch.equal(got_scores, want.scores) if device.type == "cpu" else \
                    torch.allclose(got_scores, want.scores, rtol=1e-12, atol=0), where
            acc = accept_some(got, rng, vocab)
            with no_host_reads():
                on_device.observe(got, acc, ForwardOutput(logits=torch.empty(0), hidden={}))
            count, bonus, path = int(acc.count), int(acc.bonus), acc.path.tolist()
            state.tokens += [int(got.tokens[i]) for i in path[1:count]] + [bonus]
            if len(state.tokens) > 70:
                break
    return drafted
