"""jetspec++'s foresight and decoder slice on the target's tree-attention kernel (Triton; the interpreter on
the CPU) instead of SDPA over a dense mask of the whole cache: the flat rows' attention (`flat_attention`) =
SDPA under `flat_mask` (the whole device round under either backend: `test_fused_foresight_round.py`)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.drafters.jetspecpp.foresight import flat_attention, flat_mask, flat_pattern  # noqa: E402
from specbench.models.decoder import AttentionMeta, sdpa_attention  # noqa: E402


@pytest.mark.parametrize("pattern", ["block-causal", "bidirectional"])
def test_flat_attention_equals_sdpa_under_the_flat_mask(device, pattern: str) -> None:
    g = torch.Generator().manual_seed(0)
    count, b, n, length, slots, h, hkv, d = 3, 4, 5, 7, 40, 4, 2, 64
    q = count * b
    ancestors = torch.rand(n, n, generator=g) < 0.5
    ancestors |= torch.eye(n, dtype=torch.bool)
    nodes = torch.randint(0, n, (count,), generator=g)
    rows = ancestors[nodes.repeat_interleave(b)].to(device)  # [Q, N]
    padded = flat_pattern(count, b, pattern, device)
    length_t = torch.tensor([length], device=device)
    after = torch.arange(1, slots + 1, device=device)
    kv_len = length + n + q + 3
    k = torch.randn(1, hkv, slots, d, generator=g).to(device)
    v = torch.randn(1, hkv, slots, d, generator=g).to(device)
    x = torch.randn(1, h, q, d, generator=g).to(device)
    dense = AttentionMeta(lengths=length_t, tree_mask=padded[None, :, 1: q + 1], kv_len=kv_len,
                          dense_mask=flat_mask(length_t, after[:kv_len], rows, padded))
    want = sdpa_attention(x, k, v, dense, d ** -0.5)
    meta = AttentionMeta(lengths=length_t, tree_mask=padded[None, :, 1: q + 1], kv_len=kv_len)
    got = flat_attention(torch.cat([rows, padded[:, 1: q + 1]], dim=1), kv_len)(x, k, v, meta, d ** -0.5)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)

