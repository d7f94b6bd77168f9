"""The "stats" fusion level on CUDA (no RMSNorm kernel between layers at verify's rows, `kernels/norm_stats.py`):
on the real default target in bf16, a 65-node verify pass at that level equals the gemm level's to bf16's rounding,
and its captured CUDA graph replays the eager pass exactly. Run on the device: `python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _verify_pass(model, cache, tokens, positions, mask) -> torch.Tensor:
    return model(tokens, positions, cache, mask).logits


def test_stats_level_verify_pass_on_cuda() -> None:
    from specbench.models import load_target
    from specbench.trees.base import DraftTree

    target = load_target(None, device="cuda", dtype="bfloat16")
    model = target.model
    g = torch.Generator().manual_seed(0)
    prompt = target.encode_chat("Natalia sold clips to 48 of her friends in April. How many clips did she sell?")
    paths = [torch.randint(0, model.config.vocab_size, (4,), generator=g).tolist() for _ in range(16)]
    tree = DraftTree.from_paths(prompt[-1], paths, device="cuda")  # 65 nodes
    n, p = tree.num_nodes, len(prompt)
    tokens, positions, mask = tree.tokens[None], (p + tree.depth)[None], tree.ancestor_mask[None]
    out = {}
    for level in ("gemm", "stats"):
        model.set_fused(level)
        cache = target.new_cache(2048)
        ids = torch.tensor([prompt], device="cuda")
        model(ids, torch.arange(p, device="cuda")[None], cache, None)
        cache.advance(p)
        out[level] = _verify_pass(model, cache, tokens, positions, mask)
        if level == "stats":
            static = _verify_pass(model, cache, tokens, positions, mask)  # warm-up: autotuning, the folded weights
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static = _verify_pass(model, cache, tokens, positions, mask)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static, out["stats"]), "the captured stats-level pass differs from the eager one"
    model.set_fused(True)
    a, b = out["stats"].float(), out["gemm"].float()
    assert a.shape == (1, n, model.config.vocab_size)
    assert float((a - b).norm() / b.norm()) < 2e-2
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.9  # the greedy picks of the nodes, bar near ties
