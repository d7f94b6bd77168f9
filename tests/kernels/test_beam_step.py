"""The beam step kernel (a depth of EAGLE-2's expansion after its top-k, one launch) writes the same tokens,
scores, next parents and next beam scores as `trees.grow.beam_step_ops`, ties and -inf included; `beam_grow`
grows the same tree through either."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.kernels.beam_step import MAX_CANDIDATES, beam_step  # noqa: E402
from specbench.trees.grow import beam_grow, beam_step_ops  # noqa: E402
from specbench.trees.ranking import ranked_topk  # noqa: E402


def _inputs(f: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Children of f beams, few distinct log-prob levels (ties across beams), some -inf, a positive one (clamped)."""
    g = torch.Generator().manual_seed(seed)
    lp = -torch.randint(0, 4, (f, k), generator=g).float() / 2
    lp[:, -1:] = -torch.inf if k > 2 else lp[:, -1:]
    lp[0, 0] = 0.25  # clamped to 0 by both
    lp, _ = lp.sort(dim=1, descending=True)
    tok = torch.randint(0, 4096, (f, k), generator=g)
    beams = -torch.randint(0, 3, (f,), generator=g).float() / 2
    return tok, lp, beams


@pytest.mark.parametrize("f, k, width, last", [(1, 10, 10, False), (10, 10, 10, False), (10, 10, 10, True),
                                               (3, 4, 5, False), (1, 1, 1, False), (7, 3, 32, False)])
def test_the_same_arrays_as_the_tensor_ops(device, f: int, k: int, width: int, last: bool) -> None:
    tok, lp, beams = _inputs(f, k, seed=f * 100 + k * 10 + width)
    count, w = 11, min(width, f * k)
    outs = []
    for run, dev in ((beam_step_ops, "cpu"), (beam_step, device)):
        tokens = torch.full((f * k,), -1, dtype=torch.long, device=dev)
        scores = torch.full((f * k,), 9.0, device=dev)
        parents = None if last else torch.full((w * k,), -7, dtype=torch.long, device=dev)
        nxt = run(tok.to(dev), lp.to(dev), beams.to(dev), tokens, scores, parents, count, width)
        outs.append([t if t is None else t.cpu() for t in (tokens, scores, parents, nxt)])
    for name, want, got in zip(("tokens", "scores", "parents", "next beam scores"), *outs):
        assert (want is None and got is None) or torch.equal(want, got), name


def test_beam_grow_grows_the_same_tree_through_the_kernel(device) -> None:
    """EAGLE-2's defaults (10 beams, 8 frontiers) over a drafter's random log-probs with ties: the kernel
    path's candidates and final tree are the tensor ops'."""
    vocab = 64
    g = torch.Generator().manual_seed(5)
    table = torch.log_softmax(torch.randint(0, 6, (4096, vocab), generator=g).float(), -1)

    def topk(tree, frontier, k):  # noqa: ANN001, ANN202: rows keyed by the frontier's tokens and depth
        rows = table[(tree.tokens[frontier].cpu() * 31 + tree.depth[frontier].cpu()) % table.shape[0]]
        vals, idx = ranked_topk(rows, k)
        return idx.to(frontier.device), vals.to(frontier.device)

    trees = [beam_grow(3, topk, 64, 10, 8, device=dev, use_kernel=kernel)
             for dev, kernel in (("cpu", False), (device, True))]
    for name in ("tokens", "parents", "depth", "scores"):
        assert torch.equal(getattr(trees[0], name), getattr(trees[1], name).cpu()), name


def test_bad_shapes_fail_clearly(device) -> None:
    tok = torch.zeros(2, 3, dtype=torch.long, device=device)
    lp = torch.zeros(2, 3, device=device)
    out_t, out_s = torch.zeros(6, dtype=torch.long, device=device), torch.zeros(6, device=device)
    with pytest.raises(ValueError, match="do not match"):
        beam_step(tok, lp[:, :2], torch.zeros(2, device=device), out_t, out_s, None, 0, 2)
    with pytest.raises(ValueError, match="next_parents must be"):
        beam_step(tok, lp, torch.zeros(2, device=device), out_t, out_s, torch.zeros(5, dtype=torch.long, device=device), 0, 2)
    big = torch.zeros(1, MAX_CANDIDATES + 1, dtype=torch.long, device=device)
    with pytest.raises(ValueError, match="candidates"):
        beam_step(big, big.float(), torch.zeros(1, device=device), big[0], big[0].float(), None, 0, 2)
