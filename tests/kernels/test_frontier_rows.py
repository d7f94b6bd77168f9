"""The frontier-rows kernel (eagle3's per-depth bookkeeping, one launch) returns and writes what
`frontier_rows_ops` does: the parents' rows, the tokens, and the frontier's new rows in the node table."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.drafters.eagle3.drafter import frontier_rows_ops  # noqa: E402
from specbench.kernels.frontier_rows import MAX_FRONTIER, frontier_rows  # noqa: E402


@pytest.mark.parametrize("nodes, f, strided", [(11, 1, False), (111, 10, True), (711, 100, False), (2000, 700, True)])
def test_the_same_rows_and_tokens_as_the_tensor_ops(device, nodes: int, f: int, strided: bool) -> None:
    g = torch.Generator().manual_seed(nodes + f)
    parents = torch.cat([torch.tensor([-1]), torch.randint(0, nodes - f, (nodes - 1,), generator=g)])
    parents[nodes - f:] = torch.randint(0, nodes - f, (f,), generator=g)  # the frontier's parents: earlier nodes
    tokens = torch.randint(0, 49152, (nodes,), generator=g)
    table = torch.randint(0, 1024, (4096,), generator=g)
    frontier = torch.arange(nodes - f, nodes)[torch.randperm(f, generator=g)]
    if strided:  # beam_grow's frontier: every k-th entry of the next parents
        frontier = frontier.repeat_interleave(3).view(-1, 3)[:, 0]
    outs = []
    for run, dev in ((frontier_rows_ops, "cpu"), (frontier_rows, device)):
        rows = table.clone().to(dev)
        got = run(frontier.to(dev), parents.to(dev), tokens.to(dev), rows, 37)
        outs.append([t.cpu() for t in (*got, rows)])
    for name, want, got in zip(("parent rows", "tokens", "node table"), *outs):
        assert torch.equal(want, got), name
    assert torch.equal(outs[1][2][frontier], torch.arange(37, 37 + f))


def test_bad_sizes_are_refused(device) -> None:
    with pytest.raises(ValueError, match="frontier nodes"):
        frontier_rows(torch.zeros(MAX_FRONTIER + 1, dtype=torch.long, device=device), torch.zeros(4, dtype=torch.long),
                      torch.zeros(4, dtype=torch.long), torch.zeros(8, dtype=torch.long), 1)
