"""tree_accept against the reference walk, and the reference against the project's greedy verifier."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not importable: the kernel tests need it (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from kernel_cases import random_parents  # noqa: E402

from specbench.config import SamplingConfig  # noqa: E402
from specbench.kernels.reference import tree_accept_reference  # noqa: E402
from specbench.kernels.tree_accept import MAX_NODES, tree_accept  # noqa: E402
from specbench.trees.base import DraftTree  # noqa: E402
from specbench.verify import VERIFIERS  # noqa: E402
from specbench.verify.base import TorchRandomness  # noqa: E402


def _random_case(n: int, vocab: int, g: torch.Generator, plant: bool):
    """A random tree over a tiny vocabulary (many duplicate siblings). With `plant`, the argmax is
    set along the path to a random node so that a deep acceptance happens."""
    parents = random_parents(n, g, max_back=5)
    tokens = torch.randint(0, vocab, (n,), generator=g)
    argmax = torch.randint(0, vocab, (n,), generator=g)
    if plant:
        node = int(torch.randint(0, n, (1,), generator=g))
        while parents[node] >= 0:
            argmax[parents[node]] = tokens[node]
            node = int(parents[node])
    return tokens, parents, argmax


@pytest.mark.parametrize("vocab", [2, 5, 50])
def test_matches_reference_walk(device, vocab) -> None:
    g = torch.Generator().manual_seed(vocab)
    for trial in range(40):
        n = [1, 2, 3, 17, 40, 64, 65, 100][trial % 8]
        tokens, parents, argmax = _random_case(n, vocab, g, plant=trial % 2 == 0)
        got = tree_accept(tokens.to(device), parents.to(device), argmax.to(device))
        ref = tree_accept_reference(tokens, parents, argmax)
        assert torch.equal(got.packed.cpu(), ref), f"n={n} trial={trial}"
        length = int(got.length)
        assert got.path[:length].tolist() == ref[2:2 + length].tolist() and int(got.bonus) == int(ref[1])


def test_batch_rows_and_fused_logits(device) -> None:
    g = torch.Generator().manual_seed(1)
    rows = [_random_case(30, 3, g, plant=True) for _ in range(4)]
    tokens, parents, argmax = (torch.stack(t) for t in zip(*rows))
    logits = torch.randn(4, 30, 3, generator=g)
    logits.scatter_(2, argmax[..., None], 10.0)  # the argmax of each row is `argmax`
    got = tree_accept(tokens.to(device), parents.to(device), logits=logits.to(device))
    assert torch.equal(got.packed.cpu(), tree_accept_reference(tokens, parents, argmax))


def test_largest_tree(device) -> None:
    g = torch.Generator().manual_seed(2)
    tokens, parents, argmax = _random_case(MAX_NODES, 2, g, plant=True)
    got = tree_accept(tokens.to(device), parents.to(device), argmax.to(device))
    assert torch.equal(got.packed.cpu(), tree_accept_reference(tokens, parents, argmax))
    with pytest.raises(ValueError, match="1..1024 nodes"):
        tree_accept(torch.zeros(MAX_NODES + 1, dtype=torch.long, device=device),
                    torch.zeros(MAX_NODES + 1, dtype=torch.long, device=device),
                    torch.zeros(MAX_NODES + 1, dtype=torch.long, device=device))


def test_reference_equals_greedy_verifier() -> None:
    """The reference's semantics are the project's greedy walk (first matching child wins)."""
    g = torch.Generator().manual_seed(3)
    greedy = VERIFIERS.build("greedy")
    for trial in range(30):
        n = 1 + trial * 3
        tokens, parents, argmax = _random_case(n, 3, g, plant=True)
        depth = torch.zeros(n, dtype=torch.long)
        for i in range(1, n):
            depth[i] = depth[parents[i]] + 1
        tree = DraftTree(tokens=tokens, parents=parents, depth=depth)
        logits = torch.nn.functional.one_hot(argmax, 3).float()
        res = greedy.verify(tree, logits, SamplingConfig(temperature=0.0), TorchRandomness(0))
        ref = tree_accept_reference(tokens, parents, argmax).tolist()
        assert ref[0] == len(res.path) and ref[2:2 + ref[0]] == res.path
        assert [int(tokens[i]) for i in res.path[1:]] + [ref[1]] == res.tokens


@pytest.mark.gpu
def test_full_size_trees_on_gpu(cuda) -> None:
    g = torch.Generator().manual_seed(4)
    for n in (16, 64, 256, 1024):
        for vocab in (2, 8):
            tokens, parents, argmax = _random_case(n, vocab, g, plant=True)
            got = tree_accept(tokens.to(cuda), parents.to(cuda), argmax.to(cuda))
            assert torch.equal(got.packed.cpu(), tree_accept_reference(tokens, parents, argmax))


def test_batched_walk_through_the_kernel_equals_the_torch_walk() -> None:
    """The verifiers' batched walk takes the tree_accept kernel on CUDA; both paths agree on random
    trees with duplicate siblings (here under the interpreter or on a GPU)."""
    from specbench.trees.base import DraftTree
    from specbench.verify.vectorised import walk_batched

    g = torch.Generator().manual_seed(11)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for _ in range(25):
        n = int(torch.randint(1, 40, (1,), generator=g))
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
        depth = [0] * n
        for i in range(1, n):
            depth[i] = depth[parents[i]] + 1
        tokens = torch.randint(0, 3, (n,), generator=g)
        tree = DraftTree(tokens.to(dev), torch.tensor(parents, device=dev), torch.tensor(depth, device=dev))
        picks = torch.randint(0, 3, (n,), generator=g).to(dev)
        a = walk_batched(tree, picks, use_kernel=True)
        b = walk_batched(tree, picks, use_kernel=False)
        assert (a.path, a.tokens) == (b.path, b.tokens)


def test_padding_nodes_are_never_accepted(device) -> None:
    """A tree padded to a static size with parentless nodes accepts what the unpadded tree accepts,
    whatever the padding's tokens (even ones equal to the root's pick)."""
    g = torch.Generator().manual_seed(4)
    for trial in range(20):
        tokens, parents, argmax = _random_case(12, 3, g, plant=True)
        pad = 5
        tok_p = torch.cat([tokens, torch.full((pad,), int(argmax[0]))])
        par_p = torch.cat([parents, torch.full((pad,), -1)])
        pick_p = torch.cat([argmax, torch.randint(0, 3, (pad,), generator=g)])
        got = tree_accept(tok_p.to(device), par_p.to(device), pick_p.to(device)).packed.cpu()
        ref = tree_accept_reference(tokens, parents, argmax)
        assert torch.equal(got[: ref.numel()], ref) and bool((got[ref.numel():] == -1).all()), trial
        assert torch.equal(tree_accept_reference(tok_p, par_p, pick_p), got)
