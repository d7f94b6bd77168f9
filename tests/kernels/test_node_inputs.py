"""The node-inputs kernel (an EAGLE-3 head pass's inputs, one launch) returns and writes what `node_inputs_ops`
does with the fused RMSNorm: the normed, concatenated layer input, the parents' hidden rows and the nodes'
packed visibility bits, in fp32 and bf16, and leaves every other row of the bits as it was."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.drafters.eagle3.drafter import node_inputs_ops  # noqa: E402
from specbench.kernels.fused import rmsnorm  # noqa: E402
from specbench.kernels.masks import pack_tree_mask  # noqa: E402
from specbench.kernels.node_inputs import node_inputs  # noqa: E402


@pytest.mark.parametrize("f, first, d, dtype", [(1, 1, 64, torch.float32), (10, 5, 96, torch.float32),
                                                (16, 40, 576, torch.bfloat16), (33, 64, 48, torch.bfloat16)])
def test_the_same_inputs_and_bits_as_the_tensor_ops(device, f: int, first: int, d: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(f * d + first)
    rows, vocab = 128, 500
    embed = torch.randn(vocab, d, generator=g).to(dtype)
    hidden_rows = (3 * torch.randn(rows, d, generator=g)).to(dtype)
    norms = [(1 + 0.1 * torch.randn(d, generator=g)).to(dtype) for _ in range(2)]
    tokens = torch.randint(0, vocab, (f,), generator=g)
    parent_rows = torch.randint(0, first, (f,), generator=g)  # earlier rows than the new ones
    own = pack_tree_mask(torch.eye(rows, dtype=torch.bool)[:, 1:])  # [R, W]: row r's own bit (row 0: none)
    bits = torch.randint(-2**31, 2**31 - 1, own.shape, generator=g, dtype=torch.int32)
    outs = []
    for run, dev in ((node_inputs_ops, device), (node_inputs, device)):
        b = bits.clone().to(dev)
        kw = {"norm": rmsnorm} if run is node_inputs_ops else {}  # the fused norm: the rounding the kernel keeps
        x, hidden = run(tokens.to(dev), parent_rows.to(dev), embed.to(dev), hidden_rows.to(dev), norms[0].to(dev),
                        norms[1].to(dev), 1e-5, b, own.to(dev), first, **kw)
        outs.append([t.cpu() for t in (x, hidden, b)])
    for name, want, got in zip(("x", "hidden", "bits"), *outs):
        assert want.dtype == got.dtype and torch.equal(want, got), name
    new = slice(first, first + f)
    assert torch.equal(outs[1][2][new], bits[parent_rows] | own[new])
    keep = torch.ones(rows, dtype=torch.bool)
    keep[new] = False
    assert torch.equal(outs[1][2][keep], bits[keep])


def test_bad_shapes_are_refused(device) -> None:
    z = torch.zeros(4, dtype=torch.long, device=device)
    bits = torch.zeros(8, 1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="outside the 8 rows"):
        node_inputs(z, z, torch.zeros(5, 16, device=device), torch.zeros(8, 16, device=device),
                    torch.ones(16, device=device), torch.ones(16, device=device), 1e-5, bits, bits.clone(), 6)
    with pytest.raises(ValueError, match="differ"):
        node_inputs(z, z, torch.zeros(5, 16, device=device, dtype=torch.bfloat16), torch.zeros(8, 16, device=device),
                    torch.ones(16, device=device), torch.ones(16, device=device), 1e-5, bits, bits.clone(), 1)
