"""tree_attention / context_attention against the float64 dense-mask reference on fresh random inputs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not importable: the kernel tests need it (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from kernel_cases import ancestor_mask, random_parents, rel_err  # noqa: E402

from specbench.kernels.masks import block_causal_mask, pack_tree_mask, unpack_tree_mask  # noqa: E402
from specbench.kernels.reference import context_attention_reference, tree_attention_reference  # noqa: E402
from specbench.kernels.tree_attention import (  # noqa: E402
    AttentionConfig,
    context_attention,
    plan_attention,
    tree_attention,
)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _inputs(batch, heads, kv_heads, dim, n, lengths, dtype, device, seed, extra_slots=3):
    g = torch.Generator().manual_seed(seed)
    slots = max(lengths) + n + extra_slots
    q = torch.randn(batch, heads, n, dim, generator=g).to(dtype).to(device)
    k = torch.randn(batch, kv_heads, slots, dim, generator=g).to(dtype).to(device)
    v = torch.randn(batch, kv_heads, slots, dim, generator=g).to(dtype).to(device)
    masks = torch.stack([ancestor_mask(random_parents(n, g, max_back=4)) for _ in range(batch)])
    return q, k, v, torch.tensor(lengths, device=device), pack_tree_mask(masks).to(device)


def _config(heads, kv_heads, n, splits):
    rows = heads // kv_heads * n
    return AttentionConfig(16 if rows <= 16 else 64, 32, 4, 2, splits)


# (batch, heads, kv heads, head dim, N, committed lengths): N = 1, C = 0, GQA 1/3/4, odd sizes,
# masks of one and of several words, rows of one batch at different lengths.
SMALL = [
    (1, 1, 1, 64, 1, [0]),
    (1, 4, 1, 64, 1, [77]),
    (2, 6, 2, 64, 13, [0, 45]),
    (1, 3, 3, 128, 5, [130]),
    (2, 8, 2, 128, 37, [100, 3]),
    (1, 12, 3, 64, 70, [33]),
    (1, 2, 2, 64, 33, [10]),  # a tile's last node starts a key tile (the lower-triangular bound)
    (1, 2, 2, 64, 65, [20]),
]


@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("case", SMALL, ids=lambda c: "b{}h{}kv{}d{}n{}c{}".format(*c[:5], "-".join(map(str, c[5]))))
def test_tree_attention_fp32(device, case, splits) -> None:
    b, h, hkv, d, n, lengths = case
    q, k, v, lens, bits = _inputs(b, h, hkv, d, n, lengths, torch.float32, device, seed=SMALL.index(case))
    cfg = None if splits is None else _config(h, hkv, n, splits)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    got = tree_attention(q, k, v, lens, bits, d ** -0.5, config=cfg, out=out)
    ref = tree_attention_reference(q, k, v, lens, bits, d ** -0.5)
    assert got.data_ptr() == out.data_ptr()
    assert rel_err(got, ref) <= TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [SMALL[2], SMALL[4]], ids=["gqa3", "gqa4-d128"])
def test_tree_attention_half(device, case, dtype) -> None:
    b, h, hkv, d, n, lengths = case
    q, k, v, lens, bits = _inputs(b, h, hkv, d, n, lengths, dtype, device, seed=7)
    got = tree_attention(q, k, v, lens, bits, d ** -0.5, config=_config(h, hkv, n, 2))
    ref = tree_attention_reference(q, k, v, lens, bits, d ** -0.5)
    assert got.dtype == dtype
    assert rel_err(got, ref) <= TOL[dtype]


def test_output_does_not_depend_on_unread_slots(device) -> None:
    """Slots past len + N (stale K/V of rejected nodes) must not leak into the result."""
    q, k, v, lens, bits = _inputs(2, 4, 2, 64, 9, [20, 11], torch.float32, device, seed=3, extra_slots=40)
    first = tree_attention(q, k, v, lens, bits, 0.125, config=_config(4, 2, 9, 2))
    k[:, :, 29:].normal_()
    v[:, :, 29:].normal_()
    k[1, :, 20:].normal_()  # row 1 ends at 11 + 9 = 20
    v[1, :, 20:].normal_()
    assert torch.equal(first, tree_attention(q, k, v, lens, bits, 0.125, config=_config(4, 2, 9, 2)))


@pytest.mark.parametrize("mask_kind", ["block-causal", "bidirectional", "random"])
def test_context_attention_separate_kv(device, mask_kind) -> None:
    """Draft-head use: injected context K/V plus separate new K/V under an arbitrary mask."""
    g = torch.Generator().manual_seed(11)
    b, h, hkv, d, n = 2, 8, 2, 64, 16
    q = torch.randn(b, h, n, d, generator=g).to(device)
    ctx_k = torch.randn(b, hkv, 50, d, generator=g).to(device)
    ctx_v = torch.randn(b, hkv, 50, d, generator=g).to(device)
    new_k = torch.randn(b, hkv, n, d, generator=g).to(device)
    new_v = torch.randn(b, hkv, n, d, generator=g).to(device)
    ctx_lengths = torch.tensor([50, 17], device=device)
    if mask_kind == "block-causal":
        mask = block_causal_mask(n, 4)[None].expand(b, n, n)
    elif mask_kind == "bidirectional":
        mask = torch.ones(b, n, n, dtype=torch.bool)
    else:
        mask = torch.rand(b, n, n, generator=g) < 0.3
    bits = pack_tree_mask(mask).to(device)
    for splits in (1, 3):
        got = context_attention(q, ctx_k, ctx_v, ctx_lengths, new_k, new_v, bits, 0.1,
                                config=_config(h, hkv, n, splits))
        ref = context_attention_reference(q, ctx_k, ctx_v, ctx_lengths, new_k, new_v, bits, 0.1)
        assert rel_err(got, ref) <= TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, nk", [(1, 1), (3, 40), (8, 65)])
def test_fewer_queries_than_new_keys(device, dtype, n, nk) -> None:
    """One depth of a draft tree: the last N of NK new entries attend to the prefix and, under the mask,
    to all NK new keys (EAGLE-3's head pass), in the target-cache layout (new keys after the prefix)."""
    g = torch.Generator().manual_seed(5)
    b, h, hkv, d = 2, 4, 2, 64
    lengths = [23, 71]
    k = torch.randn(b, hkv, 71 + nk + 5, d, generator=g).to(dtype).to(device)
    v = torch.randn(b, hkv, 71 + nk + 5, d, generator=g).to(dtype).to(device)
    q = torch.randn(b, h, n, d, generator=g).to(dtype).to(device)
    mask = torch.rand(b, n, nk, generator=g) < 0.4
    mask[:, :, 0] = True
    bits = pack_tree_mask(mask).to(device)
    lens = torch.tensor(lengths, device=device)
    ref = context_attention_reference(q, k, v, lens, k, v, bits, 0.125, new_after_context=True, num_new=nk)
    for splits in (1, 2):
        got = context_attention(q, k, v, lens, k, v, bits, 0.125, new_after_context=True, num_new=nk,
                                config=_config(h, hkv, n, splits))
        assert rel_err(got, ref) <= TOL[dtype]
    with pytest.raises(ValueError, match="lower_triangular"):
        if nk != n:
            context_attention(q, k, v, lens, k, v, bits, 0.125, new_after_context=True, num_new=nk, lower_triangular=True)
        else:
            raise ValueError("lower_triangular: n == nk, nothing to refuse")


def test_row_that_sees_nothing_is_zero(device) -> None:
    g = torch.Generator().manual_seed(5)
    b, h, hkv, d, n = 1, 2, 1, 64, 6
    q = torch.randn(b, h, n, d, generator=g).to(device)
    kv = [torch.randn(b, hkv, n, d, generator=g).to(device) for _ in range(4)]
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
    mask[2] = False  # query 2 sees no key: no prefix, empty mask row
    got = context_attention(q, kv[0], kv[1], torch.zeros(1, dtype=torch.long, device=device), kv[2], kv[3],
                            pack_tree_mask(mask[None]).to(device), 0.125)
    ref = context_attention_reference(q, kv[0], kv[1], torch.zeros(1, dtype=torch.long, device=device), kv[2], kv[3],
                                      pack_tree_mask(mask[None]).to(device), 0.125)
    assert torch.isfinite(got).all() and float(got[0, :, 2].abs().max()) == 0.0
    assert rel_err(got, ref) <= TOL[torch.float32]


def test_pack_roundtrip() -> None:
    g = torch.Generator().manual_seed(0)
    for n in (1, 31, 32, 33, 70):
        mask = torch.rand(3, n, n, generator=g) < 0.5
        bits = pack_tree_mask(mask)
        assert bits.dtype == torch.int32 and bits.shape == (3, n, (n + 31) // 32)
        assert torch.equal(unpack_tree_mask(bits, n), mask)


def test_plan_splits_long_contexts_only() -> None:
    cpu = torch.device("cpu")
    assert plan_attention(1, 8, 4, 16, context_hint=0, device=cpu).num_splits == 1
    assert plan_attention(8, 8, 4, 256, context_hint=100_000, device=cpu).num_splits == 1  # enough programs
    long = plan_attention(1, 1, 4, 16, context_hint=100_000, device=cpu)
    assert long.num_splits > 1


# (batch, heads, kv heads, head dim, N, committed lengths, splits): splits with no key (short prefixes, a
# zero one), several row tiles, a split count past the key tiles
FUSED = [
    (1, 4, 1, 64, 1, [77], 3),
    (2, 6, 2, 64, 13, [0, 45], 5),
    (1, 12, 3, 64, 70, [33], 3),
    (1, 3, 3, 128, 5, [130], 7),
    (2, 2, 2, 64, 9, [200, 5], 4),
]


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the early merge reads unwritten partials
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", FUSED, ids=lambda c: "b{}h{}kv{}d{}n{}s{}".format(*c[:5], c[6]))
def test_fused_merge_equals_the_merge_kernel(device, case, dtype) -> None:
    """The last split's merge gives the merge kernel's output (the same bits under the interpreter, whose
    programs run in order), and leaves the tickets zero, so the next call (here with other lengths) is
    right too."""
    b, h, hkv, d, n, lengths, splits = case
    q, k, v, lens, bits = _inputs(b, h, hkv, d, n, lengths, dtype, device, seed=FUSED.index(case))
    rows = h // hkv * n
    block_m = 16 if rows <= 16 else 64
    kernel = AttentionConfig(block_m, 32, 4, 2, splits)
    fused = AttentionConfig(block_m, 32, 4, 2, splits, fused_merge=True)
    counters = torch.zeros(b * hkv * -(-rows // block_m), dtype=torch.int32, device=device)
    for lens_now in (lens, torch.clamp(lens - 40, min=0)):
        want = tree_attention(q, k, v, lens_now, bits, d ** -0.5, config=kernel)
        got = tree_attention(q, k, v, lens_now, bits, d ** -0.5, config=fused, out=torch.full_like(q, float("nan")),
                             split_counters=counters)
        if device == "cpu":
            assert torch.equal(got, want)
        else:
            assert rel_err(got, want) <= TOL[dtype] / 100
        assert rel_err(got, tree_attention_reference(q, k, v, lens_now, bits, d ** -0.5)) <= TOL[dtype]
        assert not counters.any()
    if device == "cpu":  # the fused path ran: tickets that start at 1 let a split merge before the last one
        counters.fill_(1)
        early = tree_attention(q, k, v, lens, bits, d ** -0.5, config=fused, out=torch.zeros_like(q),
                               split_counters=counters)
        assert not torch.equal(early, tree_attention(q, k, v, lens, bits, d ** -0.5, config=kernel))
        counters.zero_()
    small = counters[:1] if counters.numel() > 1 else None  # too small for the launch: the merge kernel
    assert torch.equal(tree_attention(q, k, v, lens, bits, d ** -0.5, config=fused, split_counters=small),
                       tree_attention(q, k, v, lens, bits, d ** -0.5, config=kernel))
    with pytest.raises(ValueError, match="split_counters must be int32"):
        tree_attention(q, k, v, lens, bits, d ** -0.5, config=fused, split_counters=counters.long())


def test_bad_inputs_fail_with_a_message(device) -> None:
    q, k, v, lens, bits = _inputs(1, 4, 2, 64, 5, [8], torch.float32, device, seed=0)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        tree_attention(q[:, :3], k, v, lens, bits, 0.1)
    with pytest.raises(ValueError, match="head dim 48"):
        tree_attention(q[..., :48], k[..., :48], v[..., :48], lens, bits, 0.1)
    with pytest.raises(ValueError, match="must match"):
        tree_attention(q, k.half(), v, lens, bits, 0.1)
    with pytest.raises(ValueError, match="packed int32"):
        tree_attention(q, k, v, lens, bits.long(), 0.1)


# ---- full size, GPU only ----------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(32, 8, 128), (9, 3, 64)], ids=["qwen3-8b", "smollm2"])
@pytest.mark.parametrize("context, n", [(4096, 16), (4096, 256), (16384, 64), (0, 256), (1000, 1)])
def test_tree_attention_full_size(cuda, shape, context, n, dtype) -> None:
    h, hkv, d = shape
    q, k, v, lens, bits = _inputs(1, h, hkv, d, n, [context], dtype, cuda, seed=context + n)
    out = torch.full_like(q, float("nan"))
    got = tree_attention(q, k, v, lens, bits, d ** -0.5, kv_len=context + n, out=out)
    ref = tree_attention_reference(q, k, v, lens, bits, d ** -0.5)
    assert rel_err(got, ref) <= TOL[dtype]


@pytest.mark.gpu
def test_packing_and_attention_replay_in_a_cuda_graph(cuda) -> None:
    """No host sync or host->device copy inside: the pair is captured once and replays with new row
    lengths read from the device."""
    g = torch.Generator().manual_seed(9)
    q, k, v, lens, _ = _inputs(2, 32, 8, 128, 64, [3000, 1000], torch.bfloat16, cuda, seed=9)
    mask = torch.stack([ancestor_mask(random_parents(64, g, max_back=4)) for _ in range(2)]).to(cuda)

    def step():
        return tree_attention(q, k, v, lens, pack_tree_mask(mask), 0.088, kv_len=3064)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    lens.copy_(torch.tensor([2000, 2900], device=cuda))
    graph.replay()
    ref = tree_attention_reference(q, k, v, lens, pack_tree_mask(mask), 0.088)
    assert rel_err(captured, ref) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("n, fused", [(1, True), (17, False), (65, False)])
def test_plan_fuses_the_merge_of_the_decode_step_only(n, fused) -> None:
    """Where the H200 measured the fused merge faster (one node; docs/measurements/README.md)."""
    from specbench.kernels.tree_attention import plan_attention

    for dtype in (torch.bfloat16, torch.float32):
        assert plan_attention(1, 8, 4, n, 2048, torch.device("cpu"), dtype).fused_merge is fused
