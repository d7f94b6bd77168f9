"""`DraftHead.forward_fused` and `context_kv(fused=True)` (the batched inference passes of JetSpec++'s
foresight, through the target's layer ops) equal `DraftHead.forward` / `context_kv` bit for bit with the
reference ops, and to 1e-5 (fp32) at each fused level, for a batch of blocks over their own context K/V
(q/k norm included: Qwen3)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.drafters.heads.backbone import DraftHead, HeadConfig  # noqa: E402
from specbench.models import load_target  # noqa: E402

from kernel_cases import rel_err  # noqa: E402


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_forward_fused_equals_forward(device, preset) -> None:
    target = load_target(f"random:{preset}@1", device=device, dtype="float32")
    model, cfg = target.model, target.config
    head = DraftHead(cfg, HeadConfig(drafter="t", taps=(0, 1), num_layers=2, block_size=5, attention="block-causal"))
    head = head.init_weights(model, seed=3).to(device)
    g = torch.Generator().manual_seed(0)
    b, c, q = 3, 7, 5
    feats = torch.randn(b, c, 2 * cfg.hidden_size, generator=g).to(device)
    ctx = head.context_kv(feats, torch.arange(c, device=device).expand(b, c), model)  # the reference ops
    x = head.embed_block(torch.randint(0, cfg.vocab_size, (b, q), generator=g).to(device),
                         torch.rand(b, q, generator=g).to(device) < 0.5, model)
    positions = c + torch.arange(q, device=device)[None] + torch.arange(b, device=device)[:, None]
    mask = torch.rand(b, q, c + q, generator=g).to(device) < 0.6
    mask[:, :, c:] = torch.ones(q, q, dtype=torch.bool, device=device).tril()
    ctx_positions = torch.arange(c, device=device).expand(b, c)
    with torch.no_grad():
        want = head(x, positions, ctx, mask, model)
        assert torch.equal(head.forward_fused(x, positions, ctx, mask, model), want)  # reference ops: the same ops
        for (k, v), (kf, vf) in zip(ctx, head.context_kv(feats, ctx_positions, model, fused=True)):
            assert torch.equal(k, kf) and torch.equal(v, vf)
        for level in ("elementwise", "gemm"):
            model.set_fused(level)
            try:
                got = head.forward_fused(x, positions, ctx, mask, model)
                got_ctx = head.context_kv(feats, ctx_positions, model, fused=True)
            finally:
                model.set_fused("reference")
            assert rel_err(got, want) < 1e-5, level
            for (k, v), (kf, vf) in zip(ctx, got_ctx):
                assert rel_err(kf, k) < 1e-5 and rel_err(vf, v) < 1e-5, level
