"""The native decoder against transformers' own implementation, the tree forward against chains,
and KV-cache commit."""

from __future__ import annotations

import pytest
import torch

from specbench.models import load_target
from specbench.models.decoder import rope_cos_sin
from specbench.models.loader import native_to_hf
from specbench.trees.base import DraftTree


def _hf_reference(target):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**target.config.to_hf())
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    missing, unexpected = model.load_state_dict(native_to_hf(target.config, target.model.state_dict()), strict=False)
    assert not unexpected and all("lm_head" in m for m in missing)
    model.tie_weights()
    return model


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_parity_with_transformers_random(preset: str) -> None:
    target = load_target(f"random:{preset}@3")
    ref = _hf_reference(target)
    ids = torch.randint(0, target.config.vocab_size, (1, 37), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(ids).logits
    cache = target.new_cache(64)
    got = target.forward(ids, torch.arange(37)[None], cache).logits
    assert _rel(got, expected) <= 1e-4


def test_parity_with_transformers_smollm2(smollm2) -> None:
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(smollm2.meta["source"], dtype=torch.float32).eval()
    ids = torch.tensor([smollm2.encode_chat("Write a Python function that reverses a string.")])
    with torch.no_grad():
        expected = ref(ids).logits
    n = ids.shape[1]
    got = smollm2.forward(ids, torch.arange(n)[None], smollm2.new_cache(128), kv_len=n).logits
    assert _rel(got, expected) <= 1e-4


def _prefill(target, prompt: list[int], max_len: int = 96):
    cache = target.new_cache(max_len)
    n = len(prompt)
    target.forward(torch.tensor([prompt]), torch.arange(n)[None], cache)
    cache.advance(n)
    return cache


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_tree_forward_equals_each_branch_as_a_chain(preset: str) -> None:
    target = load_target(f"random:{preset}@1")
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 96, (11,), generator=g).tolist()
    tree = DraftTree.from_paths(7, [[3, 9, 4], [3, 1], [8, 2, 2, 5], [8, 6]])
    cache = _prefill(target, prompt)
    n0 = len(prompt)
    out = target.forward(tree.tokens[None], (n0 + tree.depth)[None], cache, tree.ancestor_mask[None], taps=(0, 1))
    for leaf in (i for i in range(tree.num_nodes) if not tree.children[i]):
        path = tree.path_to(leaf)
        chain_cache = _prefill(target, prompt)
        toks = tree.tokens[path][None]
        ref = target.forward(toks, torch.arange(n0, n0 + len(path))[None], chain_cache, taps=(0, 1))
        torch.testing.assert_close(out.logits[0, path], ref.logits[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.hidden[1][0, path], ref.hidden[1][0], rtol=1e-5, atol=1e-5)


def test_commit_turns_accepted_branch_into_causal_prefix() -> None:
    target = load_target("random:tiny-llama@2")
    prompt = list(range(5, 17))
    tree = DraftTree.from_paths(4, [[10, 11], [20, 21, 22], [30]])
    cache = _prefill(target, prompt)
    n0 = len(prompt)
    target.forward(tree.tokens[None], (n0 + tree.depth)[None], cache, tree.ancestor_mask[None])
    path = tree.path_to(5)  # root -> 20 -> 21 -> 22 (node ids 0, 3, 4, 5)
    cache.commit(path)
    assert cache.host_lengths[0] == n0 + 4 and int(cache.lengths[0]) == n0 + 4
    ref = _prefill(target, prompt + tree.tokens[path].tolist())
    L = n0 + 4
    torch.testing.assert_close(cache.k[:, :, :, :L], ref.k[:, :, :, :L], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cache.v[:, :, :, :L], ref.v[:, :, :, :L], rtol=1e-5, atol=1e-6)
    # the next token sees exactly that prefix
    nxt = torch.tensor([[42]])
    a = target.forward(nxt, torch.tensor([[L]]), cache).logits
    b = target.forward(nxt, torch.tensor([[L]]), ref).logits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_ancestor_mask_pointer_doubling_matches_walk() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        n = int(torch.randint(1, 40, (1,), generator=g))
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
        depth = [0] * n
        for i in range(1, n):
            depth[i] = depth[parents[i]] + 1
        tree = DraftTree(torch.arange(n), torch.tensor(parents), torch.tensor(depth))
        expected = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            for j in tree.path_to(i):
                expected[i, j] = True
        assert torch.equal(tree.ancestor_mask, expected)


def test_padded_tree_inputs_leave_real_nodes_unchanged() -> None:
    """The CUDA-graph path pads trees to a bucket size; the real nodes' outputs must not change and
    committing the accepted path must ignore the padding."""
    from specbench.models.graphs import pad_tree_inputs

    target = load_target("random:tiny-qwen3@4")
    prompt = list(range(3, 15))
    tree = DraftTree.from_paths(5, [[6, 7], [8]])
    n0 = len(prompt)
    tok, pos, mask = tree.tokens[None], (n0 + tree.depth)[None], tree.ancestor_mask[None]
    plain = target.forward(tok, pos, _prefill(target, prompt), mask, taps=(1,))
    cache = _prefill(target, prompt)
    ptok, ppos, pmask = pad_tree_inputs(tok, pos, mask, 9)
    padded = target.forward(ptok, ppos, cache, pmask, taps=(1,))  # whole cache read, as a graph does
    n = tree.num_nodes
    torch.testing.assert_close(padded.logits[:, :n], plain.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded.hidden[1][:, :n], plain.hidden[1], rtol=1e-5, atol=1e-5)
    cache.commit([0, 1, 2])
    ref = _prefill(target, prompt + [5, 6, 7])
    torch.testing.assert_close(cache.k[:, :, :, : n0 + 3], ref.k[:, :, :, : n0 + 3], rtol=1e-5, atol=1e-6)


def test_rope_frequencies_stay_fp32_in_bf16_models() -> None:
    target = load_target("random:tiny-qwen3@0", dtype="bfloat16")
    assert target.model.inv_freq.dtype == torch.float32
    cos, _ = target.model.rope(torch.tensor([[2000]]))
    ref = torch.cos(2000 * target.model.inv_freq.double())
    assert float((cos[0, 0, 0, : ref.numel()].double() - ref).abs().max()) < 1e-2  # bf16 output rounding only



def _rope_tables_against_the_angles(device: str, dtype: str) -> None:
    """The cache's tables gathered at positions are bitwise the angles computed there, for the target's dtype
    and the draft head's, whatever the window's length; a view of the cache shares the tables, and a pass
    given its cache reads them."""
    from specbench.drafters.heads.drafter import random_head

    target = load_target("random:tiny-qwen3@0", dtype=dtype, device=device)
    model = target.model
    cache = target.new_cache(300, batch=2)
    head = random_head("dflash", "bidirectional", False, target)
    windows = [torch.tensor([[0, 1, 7, 299], [5, 5, 128, 2]], device=device)]
    windows += [torch.arange(s, s + n, device=device)[None] for n in (1, 17, 65) for s in (0, 100, 300 - n)]
    for positions in windows:
        for want_dtype in (model.embed.weight.dtype, head.dtype):
            got = cache.rope(positions, model.inv_freq, want_dtype)
            want = rope_cos_sin(positions, model.inv_freq, want_dtype)  # computed (no cache)
            for g, w in zip(got, want):
                assert g.shape == w.shape == (*positions.shape, 1, target.config.head_dim) and g.dtype == w.dtype
                assert torch.equal(g, w)
        assert torch.equal(model.rope(positions, cache)[0], cache.rope(positions, model.inv_freq, model.embed.weight.dtype)[0])
        assert torch.equal(head.rope(positions, model, cache)[1], cache.rope(positions, model.inv_freq, head.dtype)[1])
    assert cache.rows(slice(1, 2))._rope is cache._rope


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rope_tables_of_the_cache_equal_the_computed_angles(dtype: str) -> None:
    """A forward reads RoPE from its cache's tables (two gathers): bitwise the angles' formula at those
    positions, so passes given computed angles (the jetspec++ tap stack, foresight) agree exactly."""
    _rope_tables_against_the_angles("cpu", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rope_tables_are_bitwise_the_angles_on_cuda(dtype: str) -> None:
    """The same on CUDA, where the graphed rounds read the tables."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _rope_tables_against_the_angles("cuda", dtype)


@pytest.mark.parametrize("static_shape", [False, True])
def test_masked_sdpa_equals_softmax_attention(static_shape: bool) -> None:
    """The masked-attention helper (both backend choices) is plain masked softmax attention with GQA."""
    from specbench.models.decoder import masked_sdpa

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 6, 5, 8, generator=g), torch.randn(2, 2, 11, 8, generator=g), torch.randn(2, 2, 11, 8, generator=g)
    mask = torch.rand(2, 1, 5, 11, generator=g) < 0.6
    mask[..., 0] = True
    kr, vr = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)
    scores = (q @ kr.transpose(-1, -2) * 0.3).masked_fill(~mask, float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ vr
    got = masked_sdpa(q, k, v, mask, 0.3, static_shape=static_shape)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_expand_gqa_is_what_enable_gqa_reads() -> None:
    """The repeated K/V heads (what training's masked attention runs on CUDA) give enable_gqa's output:
    query head h reads K/V head h // 3, not h % 2."""
    import torch.nn.functional as F

    from specbench.models.decoder import expand_gqa

    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 6, 5, 8, generator=g), torch.randn(2, 2, 11, 8, generator=g), torch.randn(2, 2, 11, 8, generator=g)
    mask = torch.rand(2, 1, 5, 11, generator=g) < 0.6
    mask[..., 0] = True
    kr, vr = expand_gqa(k, v, 6)
    assert kr.shape == (2, 6, 11, 8) and torch.equal(kr[:, 2], k[:, 0]) and torch.equal(vr[:, 3], v[:, 1])
    got = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask, scale=0.3)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert expand_gqa(k, v, 2) == (k, v)  # no GQA: the tensors themselves


def test_fused_level_from_the_environment(monkeypatch) -> None:
    """$SPECBENCH_FUSED_LEVEL picks the CUDA level; a value that names no level fails at once, naming the
    variable, on every device; on the CPU the reference ops stay."""
    from specbench.models.config import PRESETS
    from specbench.models.loader import build_model

    monkeypatch.setenv("SPECBENCH_FUSED_LEVEL", "fastest")
    with pytest.raises(ValueError, match="SPECBENCH_FUSED_LEVEL='fastest'"):
        build_model(PRESETS["tiny-llama"], None, dtype=torch.float32, device="cpu")
    monkeypatch.setenv("SPECBENCH_FUSED_LEVEL", "gemm")
    assert build_model(PRESETS["tiny-llama"], None, dtype=torch.float32, device="cpu").fused_level == "reference"


def test_attention_backend_from_the_environment(monkeypatch) -> None:
    """$SPECBENCH_ATTENTION names the backend "auto" means on CUDA; a value that names none fails at once,
    naming the variable, on every device; on the CPU "auto" stays SDPA and an explicit backend wins."""
    from specbench.models.config import PRESETS
    from specbench.models.loader import build_model

    monkeypatch.setenv("SPECBENCH_ATTENTION", "flash")
    with pytest.raises(ValueError, match="SPECBENCH_ATTENTION='flash'"):
        build_model(PRESETS["tiny-llama"], None, dtype=torch.float32, device="cpu")
    monkeypatch.setenv("SPECBENCH_ATTENTION", "triton-decode")
    assert build_model(PRESETS["tiny-llama"], None, dtype=torch.float32, device="cpu").attention == "sdpa"
    assert build_model(PRESETS["tiny-llama"], None, dtype=torch.float32, device="cpu",
                       attention="triton").attention == "triton"
