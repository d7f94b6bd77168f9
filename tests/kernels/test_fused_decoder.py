"""The decoder at each fused level (the element-wise kernels; those fused into the matrix products too)
equals the reference decoder (fp32, prefill, a tree verify pass and a one-row step, taps included), for each model
family's quirks (Qwen3 q/k norm, Qwen2 biases)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.models import load_target  # noqa: E402
from specbench.trees.base import DraftTree  # noqa: E402

from kernel_cases import rel_err  # noqa: E402


@pytest.mark.parametrize("level", ["elementwise", "gemm"])
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_fused_forward_equals_reference(device, preset, level) -> None:
    target = load_target(f"random:{preset}@1", device=device, dtype="float32")
    model = target.model
    prompt = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0)).to(device)
    tree = DraftTree.from_paths(5, [[1, 2, 3], [4, 6], [1, 7]], device=device)
    outs = []
    for fused in ("reference", level):
        model.set_fused(fused)
        cache = target.new_cache(32)
        pre = model(prompt, torch.arange(9, device=device)[None], cache, None, taps=(0, 1))
        cache.advance(9)
        ver = model(tree.tokens[None], (9 + tree.depth)[None], cache, tree.ancestor_mask[None], taps=(1,))
        step = model(tree.tokens[None, :1], torch.tensor([[9]], device=device), cache, None)  # one row: decode's ops
        outs.append((pre, ver, cache.k[:, :, :, : 9 + tree.num_nodes].clone(), step))
    model.set_fused("reference")
    (pre_r, ver_r, k_r, step_r), (pre_f, ver_f, k_f, step_f) = outs
    assert rel_err(pre_f.logits, pre_r.logits) < 1e-5 and rel_err(ver_f.logits, ver_r.logits) < 1e-5
    assert rel_err(step_f.logits, step_r.logits) < 1e-5
    assert rel_err(pre_f.hidden[0], pre_r.hidden[0]) < 1e-5 and rel_err(ver_f.hidden[1], ver_r.hidden[1]) < 1e-5
    assert rel_err(k_f, k_r) < 1e-5


def test_unknown_level_is_refused() -> None:
    model = load_target("random:tiny-llama@1", device="cpu", dtype="float32").model
    with pytest.raises(ValueError, match="unknown fused level 'fast'; choose one of reference, elementwise, gemm"):
        model.set_fused("fast")


def test_stats_level_runs_the_gemm_step_at_one_row(device) -> None:
    """At one row the "stats" level has nothing to fold: every op is the gemm level's, wo's matrix-vector kernel
    included (it ran cuBLAS there before: 0.81 against 0.77 ms for SmolLM2's AR step on an H100, 2026-12-07)."""
    target = load_target("random:tiny-llama@1", device=device, dtype="bfloat16")
    model = target.model
    token = torch.tensor([[7]], device=device)
    logits = []
    for level in ("gemm", "stats"):
        model.set_fused(level)
        logits.append(model(token, torch.zeros(1, 1, dtype=torch.long, device=device), target.new_cache(8), None).logits)
    model.set_fused("reference")
    assert torch.equal(logits[0], logits[1])


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_stats_level_equals_gemm_level_in_bf16(device, preset) -> None:
    """The "stats" level (no RMSNorm kernel between layers at several rows: `kernels/norm_stats.py`) computes the
    gemm level's logits, taps and K/V in bf16 (its path runs in 16-bit dtypes only; Qwen2's qkv bias takes the
    summed-stream fallback for wqkv), and its layers do pass the row statistics on."""
    from specbench.kernels.row_stats import RowStats

    target = load_target(f"random:{preset}@1", device=device, dtype="bfloat16")
    model = target.model
    prompt = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0)).to(device)
    tree = DraftTree.from_paths(5, [[1, 2, 3], [4, 6], [1, 7]], device=device)
    outs = []
    for level in ("gemm", "stats"):
        model.set_fused(level)
        cache = target.new_cache(32)
        pre = model(prompt, torch.arange(9, device=device)[None], cache, None, taps=(0, 1))
        cache.advance(9)
        ver = model(tree.tokens[None], (9 + tree.depth)[None], cache, tree.ancestor_mask[None], taps=(1,))
        one = model(tree.tokens[None, :1], (9 + tree.depth[:1])[None], cache, None)  # one row: the gemm path
        last = model(prompt, torch.arange(9, device=device)[None], target.new_cache(32), None, logits_rows="last")
        picked = model(prompt, torch.arange(9, device=device)[None], target.new_cache(32), None,
                       logits_rows=torch.tensor([2, 5], device=device), return_final_hidden=True)
        outs.append((pre, ver, one, cache.k[:, :, :, : 9 + tree.num_nodes].clone(), last, picked))
    layer, x = model.layers[0], model.embed(prompt)
    cos, sin = model.rope(torch.arange(9, device=device)[None])
    meta_cache = target.new_cache(32)
    from specbench.models.decoder import AttentionMeta

    meta = AttentionMeta(lengths=meta_cache.lengths, tree_mask=torch.ones(1, 9, 9, dtype=torch.bool, device=device).tril_(),
                         kv_len=32)
    _, pending = layer.step(x, None, cos, sin, meta_cache.k[0], meta_cache.v[0],
                            torch.arange(9, device=device)[None], meta, model.attend, model.ops)
    model.set_fused("reference")
    assert isinstance(pending, RowStats) and pending.sumsq.dtype == torch.float32
    (pre_g, ver_g, one_g, k_g, last_g, picked_g), (pre_s, ver_s, one_s, k_s, last_s, picked_s) = outs
    tol = 3e-2
    assert rel_err(last_s.logits, last_g.logits) < tol and rel_err(picked_s.logits, picked_g.logits) < tol
    assert rel_err(picked_s.final_hidden, picked_g.final_hidden) < tol
    assert rel_err(pre_s.logits, pre_g.logits) < tol and rel_err(ver_s.logits, ver_g.logits) < tol
    assert rel_err(one_s.logits, one_g.logits) < tol
    assert rel_err(pre_s.hidden[0], pre_g.hidden[0]) < tol and rel_err(ver_s.hidden[1], ver_g.hidden[1]) < tol
    assert rel_err(k_s, k_g) < tol
