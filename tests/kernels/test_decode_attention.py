"""decode_attention (tree attention at one node) against the float64 reference and the general kernel."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not importable: the kernel tests need it (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from kernel_cases import rel_err  # noqa: E402

from specbench.kernels.decode_attention import MAX_SPLITS, DecodeConfig, decode_attention, plan_decode  # noqa: E402
from specbench.kernels.masks import pack_tree_mask  # noqa: E402
from specbench.kernels.reference import tree_attention_reference  # noqa: E402
from specbench.kernels.tree_attention import tree_attention  # noqa: E402

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _inputs(batch, heads, kv_heads, dim, lengths, dtype, device, seed, sees_itself=True):
    g = torch.Generator().manual_seed(seed)
    slots = max(lengths) + 4
    q = torch.randn(batch, heads, 1, dim, generator=g).to(dtype).to(device)
    k = torch.randn(batch, kv_heads, slots, dim, generator=g).to(dtype).to(device)
    v = torch.randn(batch, kv_heads, slots, dim, generator=g).to(dtype).to(device)
    bits = pack_tree_mask(torch.full((batch, 1, 1), sees_itself, dtype=torch.bool)).to(device)
    return q, k, v, torch.tensor(lengths, device=device), bits


# (batch, heads, KV heads, head dim, committed lengths, splits): GQA 1/3/4, an empty prefix, rows of one
# batch at different lengths, more splits than key tiles (splits with no key), one split
CASES = [
    (1, 4, 1, 64, [77], 3),
    (2, 6, 2, 64, [0, 45], 5),
    (1, 9, 3, 64, [130], 7),
    (2, 8, 2, 128, [200, 5], 4),
    (1, 2, 2, 64, [40], 1),
    (1, 4, 4, 16, [3], 9),
]


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}h{}kv{}d{}s{}".format(*c[:4], c[5]))
def test_decode_equals_reference_and_resets_its_tickets(device, case, dtype) -> None:
    b, h, hkv, d, lengths, splits = case
    q, k, v, lens, bits = _inputs(b, h, hkv, d, lengths, dtype, device, seed=CASES.index(case))
    counters = torch.zeros(b * hkv, dtype=torch.int32, device=device)
    cfg = DecodeConfig(32, 4, 1, splits)
    for lens_now in (lens, torch.clamp(lens - 40, min=0)):  # the tickets are zero again for the next call
        out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
        got = decode_attention(q, k, v, lens_now, bits, d ** -0.5, context_hint=k.shape[2] - 1,
                               split_counters=counters, config=cfg, out=out)
        assert got.data_ptr() == out.data_ptr()
        assert rel_err(got, tree_attention_reference(q, k, v, lens_now, bits, d ** -0.5)) <= TOL[dtype]
        general = tree_attention(q, k, v, lens_now, bits, d ** -0.5)
        assert rel_err(got, general) <= TOL[dtype] / (10 if dtype == torch.float32 else 2)
        assert not counters.any()


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_the_merge_waits_for_the_last_split(device) -> None:
    """Tickets that start at 1 let a split merge before the last one has stored its partial: the output
    changes, so the fused merge is what ran (under the interpreter programs run in order)."""
    if device != "cpu":
        pytest.skip("program order is only fixed under the interpreter")
    q, k, v, lens, bits = _inputs(1, 4, 1, 64, [150], torch.float32, device, seed=3)
    cfg = DecodeConfig(32, 4, 1, 4)
    want = decode_attention(q, k, v, lens, bits, 0.125, context_hint=150, config=cfg)
    early = decode_attention(q, k, v, lens, bits, 0.125, context_hint=150, config=cfg, out=torch.zeros_like(q),
                             split_counters=torch.ones(1, dtype=torch.int32))
    assert not torch.equal(early, want)


def test_the_own_key_follows_the_mask_bit(device) -> None:
    """A node whose mask bit is clear sees the prefix only; with no prefix either, its output is 0."""
    q, k, v, lens, bits = _inputs(2, 4, 2, 64, [30, 0], torch.float32, device, seed=5, sees_itself=False)
    got = decode_attention(q, k, v, lens, bits, 0.125, context_hint=33, config=DecodeConfig(32, 4, 1, 3))
    assert rel_err(got[:1], tree_attention_reference(q, k, v, lens, bits, 0.125)[:1]) <= 1e-5
    assert not got[1].any()
    seen = decode_attention(q, k, v, lens, pack_tree_mask(torch.ones(2, 1, 1, dtype=torch.bool)).to(device), 0.125,
                            context_hint=33)
    assert not torch.equal(seen[:1], got[:1])


def test_plan_spreads_the_longest_context_over_tiles() -> None:
    cpu = torch.device("cpu")
    assert plan_decode(1, 8, 0, cpu).num_splits == 1
    assert plan_decode(1, 1, 100_000, cpu).num_splits == min(MAX_SPLITS, 4)  # one program per SM (4 on the CPU)
    assert plan_decode(64, 8, 100_000, cpu).num_splits == 1  # enough programs without splitting
    assert plan_decode(1, 1, 95, cpu).num_splits == 2  # 96 keys: two tiles of 64
    assert plan_decode(1, 1, 150, cpu).num_splits == 2  # three tiles: a power of two below
    assert plan_decode(1, 8, 2177, cpu).num_splits == 1  # 8 programs already fill 4 "SMs"


def test_bad_inputs_fail_with_a_message(device) -> None:
    q, k, v, lens, bits = _inputs(1, 4, 2, 64, [8], torch.float32, device, seed=0)
    with pytest.raises(ValueError, match="one query row"):
        decode_attention(q.expand(1, 4, 2, 64), k, v, lens,
                         pack_tree_mask(torch.ones(1, 2, 2, dtype=torch.bool)).to(device), 0.1, context_hint=8)
    with pytest.raises(ValueError, match="num_splits must be in"):
        decode_attention(q, k, v, lens, bits, 0.1, context_hint=8, config=DecodeConfig(32, 4, 1, MAX_SPLITS + 1))
    with pytest.raises(ValueError, match="split_counters must be int32"):
        decode_attention(q, k, v, lens, bits, 0.1, context_hint=8, split_counters=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="must match"):
        decode_attention(q, k.half(), v, lens, bits, 0.1, context_hint=8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(32, 8, 128), (9, 3, 64)], ids=["qwen3-8b", "smollm2"])
@pytest.mark.parametrize("context", [0, 63, 1000, 2177, 16384])
def test_decode_attention_full_size(cuda, shape, context, dtype) -> None:
    """The plan's config over a cache sized for the longest context, graph-free, against the reference."""
    h, hkv, d = shape
    q, k, v, lens, bits = _inputs(1, h, hkv, d, [context], dtype, cuda, seed=context)
    counters = torch.zeros(hkv, dtype=torch.int32, device=cuda)
    for _ in range(2):
        got = decode_attention(q, k, v, lens, bits, d ** -0.5, context_hint=k.shape[2] - 1, split_counters=counters,
                               out=torch.full_like(q, float("nan")))
        assert rel_err(got, tree_attention_reference(q, k, v, lens, bits, d ** -0.5)) <= TOL[dtype]
        assert not counters.any()
