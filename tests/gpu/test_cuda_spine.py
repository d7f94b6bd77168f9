"""The GPU decode path: CUDA-graph replay equals eager, and greedy SD equals AR on the device (fp32)."""

from __future__ import annotations

import pytest
import torch

from specbench.config import SpecConfig
from specbench.engine import SpecDecoder
from specbench.models import load_target

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_graphed_forward_equals_eager() -> None:
    from specbench.models.graphs import GraphedForward
    from specbench.trees.base import DraftTree

    target = load_target("random:smollm2-135m-shape@0", device="cuda", dtype="float32")
    prompt = torch.randint(0, 49152, (1, 50), device="cuda")
    eager_cache, graph_cache = target.new_cache(256), target.new_cache(256)
    for c in (eager_cache, graph_cache):
        target.forward(prompt, torch.arange(50, device="cuda")[None], c)
        c.advance(50)
    tree = DraftTree.from_paths(11, [[1, 2, 3], [4, 5]], device="cuda")
    pos = (50 + tree.depth)[None]
    eager = target.forward(tree.tokens[None], pos, eager_cache, tree.ancestor_mask[None], taps=(3,), kv_len=56)
    graphed = GraphedForward(target.model, graph_cache, buckets=[8], taps=(3,))
    out = graphed(tree.tokens[None], pos, tree.ancestor_mask[None])
    torch.testing.assert_close(out.logits, eager.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.hidden[3], eager.hidden[3], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("drafter, budget", [("ngram", 4), ("ngram", 16), ("self", 4)])
def test_greedy_sd_equals_ar_on_cuda(drafter: str, budget: int) -> None:
    target = load_target(None, device="cuda", dtype="float32")
    prompts = ["Write a Python function that returns the sum of a list.", "List three fruits and their colours."]
    ar = SpecDecoder(target, SpecConfig(), max_seq_len=512)
    sd = SpecDecoder(target, SpecConfig(drafter=drafter, budget=budget), max_seq_len=512)
    for p in prompts:
        ids = target.encode_chat(p)
        assert sd.generate(ids, 64).tokens == ar.generate(ids, 64).tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_sdpa_training_takes_no_math_path(dtype) -> None:
    """With a grad to take, masked GQA attention runs a fused kernel (enable_gqa with a mask would leave only
    the math path: no fused kernel takes both), with enable_gqa's values and gradients."""
    from torch.profiler import ProfilerActivity, profile

    from specbench.models.decoder import masked_sdpa

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(4, 9, 48, 64, device="cuda", dtype=dtype, generator=g).requires_grad_()
    k = torch.randn(4, 3, 200, 64, device="cuda", dtype=dtype, generator=g).requires_grad_()
    v = torch.randn(4, 3, 200, 64, device="cuda", dtype=dtype, generator=g).requires_grad_()
    mask = torch.rand(4, 1, 48, 200, device="cuda", generator=g) < 0.7
    mask[..., 0] = True
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = masked_sdpa(q, k, v, mask, 0.125)
        out.float().square().sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert not any("_scaled_dot_product_attention_math" in n for n in names), sorted(n for n in names if "attention" in n)
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True)
    want.float().square().sum().backward()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=tol)
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got.float(), t.grad.float(), rtol=tol, atol=tol)


def test_masked_sdpa_eager_backends_agree_with_static_choice_bf16() -> None:
    """Eager masked attention (cuDNN kept off) and PyTorch's own choice (the captured path) agree."""
    from specbench.models.decoder import masked_sdpa

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 9, 24, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 3, 300, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, 3, 300, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    mask = torch.rand(1, 1, 24, 300, device="cuda", generator=g) < 0.7
    mask[..., 0] = True
    eager = masked_sdpa(q, k, v, mask, 0.125)
    static = masked_sdpa(q, k, v, mask, 0.125, static_shape=True)
    torch.testing.assert_close(eager.float(), static.float(), rtol=2e-2, atol=2e-2)
