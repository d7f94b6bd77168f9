"""The two-pass ranked top-k kernel returns exactly the reference's ids and values (value desc, id asc,
-0.0 equal to +0.0), on rows full of ties, across chunk and merge sizes, with `tl.topk` and `tl.sort`,
and equals the packed-key path it replaces in `specbench.trees.ranking` on CUDA."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

import triton.language as tl  # noqa: E402

from specbench.kernels.ranked_topk import ranked_topk_triton  # noqa: E402
from specbench.kernels.reference import ranked_topk_reference  # noqa: E402
from specbench.trees.ranking import ranked_topk, ranked_topk_checked, ranked_topk_keys  # noqa: E402

RANKERS = [True, False] if hasattr(tl, "topk") else [False]


def _rows(rows: int, vocab: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows with many equal values (a few dozen levels), signed zeros and a -inf tail."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-40, 4, (rows, vocab), generator=g).float() / 4
    x[:, ::7] = -0.0
    x[:, 3::11] = float("-inf")
    return x.to(dtype)


@pytest.mark.parametrize("use_topk", RANKERS)
@pytest.mark.parametrize("rows, vocab, k, chunk, merge", [(3, 1500, 16, 256, 4096), (2, 700, 1, 128, 4096),
                                                          (1, 2000, 64, 128, 256), (4, 333, 5, 512, 4096),
                                                          (2, 1024, 32, 64, 128)])
def test_kernel_equals_reference(device, use_topk, rows, vocab, k, chunk, merge) -> None:
    x = _rows(rows, vocab, seed=vocab + k)
    vals, ids = ranked_topk_triton(x.to(device), k, chunk=chunk, use_topk=use_topk, merge_max=merge)
    want_vals, want_ids = ranked_topk_reference(x, k)
    assert torch.equal(ids.cpu(), want_ids)
    assert torch.equal(vals.cpu(), want_vals)


@pytest.mark.parametrize("rows, vocab, k, dtype", [(3, 1024, 10, torch.float32), (2, 1000, 1, torch.float32),
                                                   (2, 333, 333, torch.float32), (1, 1, 1, torch.float32),
                                                   (2, 2048, 16, torch.bfloat16)])
def test_a_row_in_one_program_is_ranked_in_one_launch(device, rows, vocab, k, dtype) -> None:
    """Rows up to ONE_PASS_MAX wide with the default chunk: the chunk pass writes the result itself, the same
    as the reference and as the two-pass path."""
    x = _rows(rows, vocab, seed=rows * vocab + k, dtype=dtype)
    vals, ids = ranked_topk_triton(x.to(device), k)
    want_vals, want_ids = ranked_topk_reference(x, k)
    assert torch.equal(ids.cpu(), want_ids) and torch.equal(vals.cpu(), want_vals)
    if vocab > 64:
        two_pass = ranked_topk_triton(x.to(device), k, chunk=64 if k <= 64 else 512)
        assert torch.equal(two_pass[1], ids) and torch.equal(two_pass[0], vals)


def test_signed_zeros_tie_and_values_come_back_as_stored(device) -> None:
    x = torch.tensor([[-0.0, 0.0, -1.0, -0.0, 0.0] + [-2.0] * 300])
    vals, ids = ranked_topk_triton(x.to(device), 4, chunk=64)
    assert ids.cpu().tolist() == [[0, 1, 3, 4]]
    assert torch.equal(torch.signbit(vals.cpu()), torch.tensor([[True, False, True, False]]))


def test_half_precision_rows_and_a_row_stride(device) -> None:
    x = _rows(6, 900, seed=3, dtype=torch.bfloat16)
    vals, ids = ranked_topk_triton(x.to(device)[::2], 24, chunk=128)  # every other row: stride 2 * 900
    want_vals, want_ids = ranked_topk_reference(x[::2], 24)
    assert torch.equal(ids.cpu(), want_ids) and torch.equal(vals.cpu(), want_vals)


def test_equals_the_packed_key_and_checked_paths(device) -> None:
    """What `ranked_topk` ran on CUDA before (packed keys + torch.topk) and runs on the CPU (float top-k
    with tie repair): the kernel agrees with both on tied rows wider than a chunk."""
    x = _rows(3, 2500, seed=11)
    got = ranked_topk_triton(x.to(device), 40, chunk=256)
    for vals, ids in (ranked_topk_keys(x, 40), ranked_topk_checked(x, 40)):
        assert torch.equal(got[1].cpu(), ids) and torch.equal(got[0].cpu(), vals)


@pytest.mark.parametrize("vocab, k, chunk", [(4096, 10, None), (1500, 16, 256), (700, 700, None)])
def test_an_id_map_returns_mapped_ids_in_the_same_ranking(device, vocab, k, chunk) -> None:
    """`id_map` (eagle3's d2t: increasing draft -> target ids): the ids come back mapped, in the one-launch
    and the multi-pass paths, and `trees.ranking.ranked_topk` maps the same way on every path."""
    x = _rows(3, vocab, seed=vocab + 7)
    g = torch.Generator().manual_seed(vocab)
    id_map = torch.sort(torch.randperm(5 * vocab, generator=g)[:vocab]).values  # [V] increasing, int64
    vals, ids = ranked_topk_triton(x.to(device), k, chunk=chunk, id_map=id_map.to(device))
    want_vals, want_ids = ranked_topk_reference(x, k)
    assert torch.equal(ids.cpu(), id_map[want_ids]) and torch.equal(vals.cpu(), want_vals)
    for row_device in {x.device, torch.device(device)}:
        got_vals, got_ids = ranked_topk(x.to(row_device), k, id_map=id_map.to(row_device))
        assert torch.equal(got_ids.cpu(), id_map[want_ids]) and torch.equal(got_vals.cpu(), want_vals)


@pytest.mark.parametrize("vocab, k, chunk", [(900, 6, None), (2500, 16, None), (600, 5, 128)])
def test_excluded_entries_rank_as_minus_infinity(device, vocab, k, chunk) -> None:
    """`exclude` (rows, cols): the same ranking as the reference over a copy with those entries set to -inf, the
    value -inf where one is still chosen; a negative row excludes nothing."""
    x = _rows(4, vocab, seed=vocab + k)
    g = torch.Generator().manual_seed(k)
    rows = torch.randint(-1, 4, (30,), generator=g)
    cols = torch.cat([torch.randint(0, vocab, (25,), generator=g), torch.argmax(x, -1),
                      torch.tensor([0])])
    rows[25:29] = torch.arange(4)  # each row's best entry excluded
    masked = x.clone()
    keep = rows >= 0
    masked[rows[keep], cols[keep]] = float("-inf")
    vals, ids = ranked_topk_triton(x.to(device), k, chunk=chunk, exclude=(rows.to(device), cols.to(device)))
    want_vals, want_ids = ranked_topk_reference(masked, k)
    assert torch.equal(ids.cpu(), want_ids) and torch.equal(vals.cpu(), want_vals)


def test_bad_arguments_fail_clearly(device) -> None:
    x = torch.zeros(2, 10, device=device)
    with pytest.raises(ValueError, match="k must be in"):
        ranked_topk_triton(x, 0)
    with pytest.raises(ValueError, match="float \\[rows, vocab\\]"):
        ranked_topk_triton(x[0], 3)
    with pytest.raises(ValueError, match="powers of two"):
        ranked_topk_triton(x, 3, chunk=96)
    with pytest.raises(ValueError, match="exclude must be two int64"):
        ranked_topk_triton(x, 3, exclude=(torch.zeros(2, dtype=torch.long, device=device),
                                          torch.zeros(3, dtype=torch.long, device=device)))
    with pytest.raises(ValueError, match="id_map must be an int64 \\[10\\]"):
        ranked_topk_triton(x, 3, id_map=torch.arange(9, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("rows, k", [(15, 64), (15, 256), (65, 8), (16, 16)])
def test_full_vocabulary_on_cuda_through_ranked_topk(cuda, rows, k) -> None:
    """SmolLM2's vocabulary, log-softmaxed bf16 logits (ties at every cut): `ranked_topk` on CUDA (the
    kernel) == the reference == the packed-key path."""
    g = torch.Generator().manual_seed(rows * k)
    logits = (4 * torch.randn(rows, 49152, generator=g)).bfloat16().float()
    logp = torch.log_softmax(logits, -1).to(cuda)
    vals, ids = ranked_topk(logp, k)
    want_vals, want_ids = ranked_topk_reference(logp.cpu(), k)
    assert torch.equal(ids.cpu(), want_ids) and torch.equal(vals.cpu(), want_vals)
    key_vals, key_ids = ranked_topk_keys(logp, k)
    assert torch.equal(ids, key_ids) and torch.equal(vals, key_vals)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, k", [(1, 10), (10, 10), (16, 16)])
def test_draft_vocabulary_rows_on_cuda_through_ranked_topk(cuda, rows, k) -> None:
    """eagle3's per-depth rows (4,096-token draft vocabulary, log-softmaxed bf16 logits): `ranked_topk` on CUDA
    takes the one-launch kernel past `CUDA_SORT_MAX_WIDTH` and equals the reference and the stable sort."""
    from specbench.trees.ranking import CUDA_SORT_MAX_WIDTH, ranked_topk_sorted

    assert 4096 > CUDA_SORT_MAX_WIDTH
    g = torch.Generator().manual_seed(rows + k)
    logp = torch.log_softmax((4 * torch.randn(rows, 4096, generator=g)).bfloat16().float(), -1).to(cuda)
    vals, ids = ranked_topk(logp, k)
    want_vals, want_ids = ranked_topk_reference(logp.cpu(), k)
    assert torch.equal(ids.cpu(), want_ids) and torch.equal(vals.cpu(), want_vals)
    sort_vals, sort_ids = ranked_topk_sorted(logp, k)
    assert torch.equal(ids, sort_ids) and torch.equal(vals, sort_vals)
