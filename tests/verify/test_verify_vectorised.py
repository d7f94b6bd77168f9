"""The vectorised greedy / sample-walk / chain-rs take exactly the reference rule's decisions when the
reference is fed the same per-node uniforms (replayed through the scalar primitives)."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SamplingConfig
from specbench.trees.base import DraftTree
from specbench.verify import VERIFIERS, ReplayRandomness, TorchRandomness
from specbench.verify.vectorised import (
    chain_rs_batched,
    greedy_batched,
    replayed_uniforms,
    sample_walk_batched,
)


def random_tree(n: int, vocab: int, g: torch.Generator, chain: bool) -> DraftTree:
    parents = [-1] + [i - 1 if chain else int(torch.randint(max(0, i - 4), i, (1,), generator=g)) for i in range(1, n)]
    depth = [0]
    for p in parents[1:]:
        depth.append(depth[p] + 1)
    tokens = torch.randint(0, vocab, (n,), generator=g)
    as_t = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return DraftTree(tokens=tokens, parents=as_t(parents), depth=as_t(depth))


def random_probs(n: int, vocab: int, g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Peaked rows with zeros and exact ties, so walks go deep and every branch of the rules is hit."""
    logits = 3 * torch.randn(n, vocab, generator=g, dtype=torch.float64)
    probs = torch.softmax(logits, -1)
    probs[torch.rand(n, vocab, generator=g) < 0.3] = 0.0
    probs[::3, 1] = probs[::3, 0]  # exact ties
    probs[torch.arange(n), torch.randint(0, vocab, (n,), generator=g)] += 0.5
    return (probs / probs.sum(-1, keepdim=True)).to(dtype)


def plant_path(tree: DraftTree, probs: torch.Tensor) -> None:
    """Make each node's token likely under its parent's law (so acceptances happen)."""
    for i, p in enumerate(tree.parents.tolist()):
        if p >= 0 and i % 2 == 0:
            probs[p, tree.tokens[i]] += 2.0
    probs /= probs.sum(-1, keepdim=True)


def uniforms(n: int, g: torch.Generator) -> torch.Tensor:
    u = torch.rand(n, generator=g, dtype=torch.float64)
    u[::7] = 0.0
    u[3::7] = 1.0 - 2.0 ** -53  # the largest float64 below 1
    return u


def cases(chain: bool):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(7 + chain)
    for trial in range(60):
        n = [1, 2, 3, 5, 9, 17, 33][trial % 7]
        vocab = [2, 3, 5, 7, 50][trial % 5]
        dtype = torch.float32 if trial % 2 else torch.float64
        tree = random_tree(n, vocab, g, chain)
        probs = random_probs(n, vocab, g, dtype)
        plant_path(tree, probs)
        yield tree, probs, uniforms(n, g), g


def test_sample_walk_vectorised_equals_reference() -> None:
    reference = VERIFIERS.build("sample-walk", vectorised=False)
    depths = []
    for tree, probs, u, _ in cases(chain=False):
        fast = sample_walk_batched(tree, probs, u)
        replay = ReplayRandomness(replayed_uniforms("sample-walk", tree, fast, u))
        slow = reference.verify_probs(tree, probs, replay)
        assert (slow.path, slow.tokens) == (fast.path, fast.tokens)
        assert replay.remaining == 0
        depths.append(fast.accepted_drafts)
    assert max(depths) >= 3  # the cases do exercise deep walks


@pytest.mark.parametrize("sampled", [False, True])
def test_chain_rs_vectorised_equals_reference(sampled: bool) -> None:
    reference = VERIFIERS.build("chain-rs", vectorised=False)
    accepted = []
    for tree, probs, u, g in cases(chain=True):
        if sampled and tree.num_nodes > 1:
            q = random_probs(tree.num_nodes, probs.shape[-1], g, probs.dtype)
            q[torch.arange(tree.num_nodes), tree.tokens] += 0.2  # every token is drawable from its row
            tree.draft_probs = q / q.sum(-1, keepdim=True)
        fast = chain_rs_batched(tree, probs, u)
        replay = ReplayRandomness(replayed_uniforms("chain-rs", tree, fast, u))
        slow = reference.verify_probs(tree, probs, replay)
        assert (slow.path, slow.tokens) == (fast.path, fast.tokens)
        assert replay.remaining == 0
        accepted.append(fast.accepted_drafts)
    assert max(accepted) >= 3 and min(accepted) == 0


def test_greedy_vectorised_equals_reference() -> None:
    reference = VERIFIERS.build("greedy", vectorised=False)
    for tree, probs, _, _ in cases(chain=False):
        fast = greedy_batched(tree, probs)
        slow = reference.verify_probs(tree, probs, TorchRandomness(0))
        assert (slow.path, slow.tokens) == (fast.path, fast.tokens)


@pytest.mark.parametrize("name", ["sample-walk", "chain-rs"])
def test_verify_api_uses_one_uniform_per_node(name: str) -> None:
    """Through Verifier.verify with TorchRandomness: the vectorised path draws N uniforms in one call,
    and the reference replaying those uniforms agrees."""
    fast_v = VERIFIERS.build(name)
    slow_v = VERIFIERS.build(name, vectorised=False)
    sampling = SamplingConfig(temperature=1.0)
    for seed, (tree, probs, _, _) in enumerate(cases(chain=name == "chain-rs")):
        logits = probs.double().log()
        fast = fast_v.verify(tree, logits, sampling, TorchRandomness(seed))
        u = TorchRandomness(seed).uniform(tree.num_nodes)
        slow = slow_v.verify(tree, logits, sampling, ReplayRandomness(replayed_uniforms(name, tree, fast, u)))
        assert (slow.path, slow.tokens) == (fast.path, fast.tokens)


def test_chain_rs_rejects_bad_input() -> None:
    tree = DraftTree.from_paths(0, [[1], [2]])
    probs = torch.full((3, 3), 1 / 3)
    for verifier in (VERIFIERS.build("chain-rs"), VERIFIERS.build("chain-rs", vectorised=False)):
        with pytest.raises(ValueError, match="single chain"):
            verifier.verify(tree, probs.log(), SamplingConfig(temperature=1.0), TorchRandomness(0))
    chain = DraftTree.chain(0, [2], draft_probs=torch.tensor([[0.5, 0.5, 0.0]]))
    for verifier in (VERIFIERS.build("chain-rs"), VERIFIERS.build("chain-rs", vectorised=False)):
        with pytest.raises(ValueError, match="draft probability"):
            verifier.verify(chain, probs[:2].log(), SamplingConfig(temperature=1.0), TorchRandomness(0))


def on_device(tree: DraftTree, device: str) -> DraftTree:
    probs = None if tree.draft_probs is None else tree.draft_probs.to(device)
    return DraftTree(tokens=tree.tokens.to(device), parents=tree.parents.to(device), depth=tree.depth.to(device),
                     draft_probs=probs)


@pytest.mark.gpu
def test_vectorised_on_cuda_equals_reference_on_cpu() -> None:
    """The GPU path (one host read per call) takes the reference's decisions, small and 49k vocabularies."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    g = torch.Generator().manual_seed(11)
    big = [(random_tree(33, 49152, g, chain), random_probs(33, 49152, g, torch.float32), chain) for chain in (False, True)]
    small = [(t, p, chain) for chain in (False, True) for t, p, _, _ in cases(chain)]
    for tree, probs, chain in small + big:
        name = "chain-rs" if chain else "sample-walk"
        if chain and tree.num_nodes > 1:
            q = random_probs(tree.num_nodes, probs.shape[-1], g, probs.dtype)
            q[torch.arange(tree.num_nodes), tree.tokens] += 0.2
            tree.draft_probs = q / q.sum(-1, keepdim=True)
        u = uniforms(tree.num_nodes, g)
        batched = chain_rs_batched if chain else sample_walk_batched
        fast = batched(on_device(tree, "cuda"), probs.cuda(), u)
        replay = ReplayRandomness(replayed_uniforms(name, tree, fast, u))
        slow = VERIFIERS.build(name, vectorised=False).verify_probs(tree, probs, replay)
        assert (slow.path, slow.tokens) == (fast.path, fast.tokens)
        assert greedy_batched(on_device(tree, "cuda"), probs.cuda()).path == greedy_batched(tree, probs).path
