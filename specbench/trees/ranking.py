"""Exact, deterministic ranking shared by every tree builder.

`torch.topk` leaves the order of equal values unspecified (and differs between devices), so two
builders that both call it can disagree on ties. Every builder in specbench ranks through this module:

* Token ranks at one depth (or one parent): higher log-prob first; equal log-probs: lower token id first.
* Node order: higher score first; equal scores: lower *index* first, where each caller lays its
  candidates out so that the index encodes the documented tie rule (see `specbench.trees` docs).

Scores are float32 and accumulate left to right along a path (`s(child) = s(parent) + logp`, one
float32 addition), so every builder (host heap, vectorised, brute-force reference) computes bit-identical
scores and ties resolve identically. Log-probs are clamped at 0 so that a child never outscores its parent.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

_LOW32 = 0xFFFFFFFF
CPU_KEYS_MAX_WIDTH = 4096  # rows up to this wide are ranked through keys on the CPU too
SORT_MAX_WIDTH = 4096  # rows up to this wide are ranked by one stable sort (off CUDA)
# on CUDA, rows wider than this take the ranked top-k kernel: a stable sort of eagle3's [10, 4,096] rows was 20 us
# a call on the H200 (`profile_dflash_eagle3_h200_gemv.txt.gz`: 7 of them a round), the kernel one launch there
CUDA_SORT_MAX_WIDTH = 1024


def order_keys(values: Tensor, index: Tensor) -> Tensor:
    """int64 keys whose descending order is (value descending, index ascending); unique per index.

    values: float32 [..., M]; index: int64 broadcastable to it, each in [0, 2**32).
    The float's bits are mapped to an int32 that is monotone in the float value (sign-magnitude to
    two's complement), placed in the high 32 bits; the low 32 bits hold the complemented index.
    """
    return _keys(values, _LOW32 - index)


def _keys(values: Tensor, complement: Tensor) -> Tensor:
    """`order_keys` with the complemented index (2**32 - 1 - index) given."""
    bits = (values.float() + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0 (they compare equal)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered.long() << 32) | complement


def top_indices(values: Tensor, k: int) -> Tensor:
    """Positions [..., k] of the k best entries of values [..., M] (each row) in order: value descending,
    position ascending (a stable sort: one op on any device, no host synchronisation)."""
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :k]


def ranked_topk(x: Tensor, k: int, id_map: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(values [R, k] float32, indices [R, k] int64): the k largest entries of each row of x [R, V],
    value descending, equal values by lower index. Exact on every device.

    On CUDA, rows wider than `CUDA_SORT_MAX_WIDTH` (a draft vocabulary, the whole vocabulary): the packed
    keys ranked on chip by `specbench.kernels.ranked_topk` (a chunk pass and a merge, two launches; no
    host read: what the GPU round captures), where `torch.topk` over the keys is a multi-pass radix select
    and a stable sort of a 4,096-wide row was ~20 us. Narrower rows (a tree's nodes), and rows up to
    `SORT_MAX_WIDTH` elsewhere: one stable sort, two kernels. Wider rows on the CPU: a float top-k plus
    tie checks on the k+1 kept values (packing keys over a whole vocabulary costs several passes there);
    elsewhere one top-k over packed keys. `id_map` [V]: the indices come back as id_map[indices] (on CUDA
    in the kernel's launch: eagle3's draft ids -> target ids).
    """
    if x.dim() != 2:
        raise ValueError(f"ranked_topk expects a 2-D [rows, vocab] tensor, got shape {tuple(x.shape)}")
    k = min(int(k), x.shape[-1])
    if x.shape[-1] > CUDA_SORT_MAX_WIDTH and x.is_cuda and k >= 1:  # the kernel reads bf16 itself: no float copy
        from specbench.kernels.ranked_topk import ranked_topk_triton

        return ranked_topk_triton(x, k, id_map=id_map)
    x = x.float()
    if x.shape[-1] <= SORT_MAX_WIDTH:
        vals, idx = ranked_topk_sorted(x, k)
    elif x.device.type == "cpu" and x.shape[-1] > CPU_KEYS_MAX_WIDTH:
        vals, idx = ranked_topk_checked(x, k)
    else:
        vals, idx = ranked_topk_keys(x, k)
    return vals, (idx if id_map is None else id_map[idx])


def ranked_topk_sorted(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`ranked_topk` through one stable descending sort per row (sync-free; on CUDA a row of <= 4,096
    entries is sorted in one in-place kernel). `+ 0.0` turns -0.0 into +0.0 first: a radix sort orders
    them by their bits, the tie rule calls them equal (a -0.0 comes back as +0.0, an equal value)."""
    vals, idx = torch.sort(x.float() + 0.0, dim=-1, descending=True, stable=True)
    return vals[..., :k], idx[..., :k]


def ranked_topk_keys(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`ranked_topk` through packed keys: sync-free, used off the CPU."""
    keys = _keys(x, torch.arange(_LOW32, _LOW32 - x.shape[-1], -1, device=x.device))  # order_keys(x, ids)
    idx = torch.topk(keys, k, dim=-1, sorted=True).indices  # the keys are unique: their order is the ranking
    return x.gather(-1, idx), idx


def ranked_topk_checked(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`ranked_topk` through a float top-k of k+1 entries: a row whose (k+1)-th value equals its k-th
    has a tie across the cut and is redone exactly (rare); rows with equal values inside the top k
    are re-sorted by (value desc, index asc)."""
    vocab = x.shape[-1]
    vals, idx = torch.topk(x, min(k + 1, vocab), dim=-1, sorted=True)
    tied_rows: list[int] = []
    if k < vocab:
        tied_rows = (vals[:, k] == vals[:, k - 1]).nonzero().flatten().tolist() if k else []
        vals, idx = vals[:, :k], idx[:, :k]
        if tied_rows:
            idx = idx.clone()
            for row in tied_rows:  # the right set; the sort below orders it
                kth = vals[row, -1]
                above = (x[row] > kth).nonzero().flatten()
                at = (x[row] == kth).nonzero().flatten()[: k - above.numel()]  # the lowest ids
                idx[row] = torch.cat([above, at])
            vals = x.gather(-1, idx)
    if tied_rows or (k > 1 and bool((vals[:, 1:] == vals[:, :-1]).any())):
        by_index = idx.sort(dim=-1).indices
        idx, vals = idx.gather(-1, by_index), vals.gather(-1, by_index)
        by_value = torch.sort(vals, dim=-1, descending=True, stable=True).indices  # stable: ids stay ascending
        idx, vals = idx.gather(-1, by_value), vals.gather(-1, by_value)
    return vals, idx


def host_table(tokens: torch.Tensor, logp: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
    """A ranked top-k table [D, k] as Python lists in one device->host copy; log-probs float32, clamped
    at 0 (so children never outscore parents). ValueError on NaN."""
    lp = logp.float().clamp(max=0.0)
    if bool(torch.isnan(lp).any()):
        raise ValueError("draft log-probs contain NaN: check the drafter's logits (dtype overflow?)")
    packed = torch.stack([tokens.double(), lp.double()]).cpu()  # token ids < 2**53: exact in float64
    return packed[0].long().tolist(), packed[1].tolist()


def f32_add(a: float, b: float) -> float:
    """The float32 sum of two float32 values (as Python floats): one correctly rounded float32 addition,
    the same operation the tensor builders perform."""
    return float(np.float32(a + b))  # a + b in float64 then rounded: exact for float32 addition
