"""Tree attention: N new queries against a visible prefix plus N new keys under a packed bitmask.

`context_attention` is the general form: the prefix and the new keys may be separate tensors, under
any packed mask. Its one caller is `tree_attention`, the target's verification pass, where the prefix
is the committed part [0, len) of the static KV cache and the tree's own keys sit right after it, at
slots [len, len + N). (No draft head calls it: the heads run masked SDPA.)

Work split. The query heads that share a KV head are processed together (rows = G heads x N nodes,
node-major), so each K/V tile is read once per group. When there are too few (batch, KV head, row
tile) programs to fill the GPU (small N, long prefix), the prefix is split into `num_splits` equal
chunks of each row's own length (flash-decoding; a run-time argument, so no recompilation per count);
every split writes a normalised partial output and its log-sum-exp, and they are merged: by a second
kernel, or (`fused_merge`, given a zeroed int32 `split_counters` workspace that outlives the call) by
whichever split of a row tile finishes last, which it learns from an atomic ticket, resetting the ticket
for the next launch. The fused merge saves a launch and its gap per layer; it reads the splits that hold
keys only, in split order, so both merges give the same bits.
Row lengths are read on the device, so there is no host sync and a launch can be captured in a CUDA
graph. Softmax is online, in fp32 (base 2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import interpreting, num_sms, require_kernel_device
from specbench.kernels.masks import num_words

LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128)
# The plan fuses the merge for trees of at most this many nodes: the decode step. On an H200 (2026-12-03,
# docs/measurements/README.md) the fused merge ran Qwen3-8B's one-node attention in 10.6 us against 12.0 (its
# AR step 4.73-4.75 ms against 4.79-4.82 back to back), SmolLM2's in 6.7 against 6.5 (its AR step unchanged
# within 0.01 ms), and lost at 17 and 65 nodes for both (SmolLM2 9.1 against 8.2 us, Qwen3-8B 21.7 against 17.9).
FUSED_MERGE_MAX_NODES = 1
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _online_softmax_step(qk, v, m_i, l_i, acc, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """Fold one tile of base-2 scores qk [M, S] (masked entries -inf) and values v [S, D] in."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet stays at 0
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        pv = tl.dot(p, v, input_precision="ieee")
    elif UPCAST:  # the interpreter's numpy matmul has no bf16
        pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32))
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _scores(q, k, qk_scale, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    if IEEE:
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")
    elif UPCAST:
        qk = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
    else:
        qk = tl.dot(q, tl.trans(k))
    return qk * qk_scale


@triton.jit
def _attend_range(q, k_base, v_base, stride_ks, stride_vs, lo, hi, d, m_i, l_i, acc, qk_scale,
                  BLOCK_S: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """Fold keys [lo, hi) of one KV head (every one visible) into the online softmax of q [M, D]."""
    for start in range(lo, hi, BLOCK_S):
        s = start + tl.arange(0, BLOCK_S)
        in_range = s < hi
        k = tl.load(k_base + s[:, None] * stride_ks + d[None, :], mask=in_range[:, None], other=0.0)  # [S, D]
        v = tl.load(v_base + s[:, None] * stride_vs + d[None, :], mask=in_range[:, None], other=0.0)
        qk = _scores(q, k, qk_scale, IEEE, UPCAST)
        qk = tl.where(in_range[None, :], qk, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, IEEE, UPCAST)
    return m_i, l_i, acc


@triton.jit
def _attention_kernel(
    Q, KC, VC, KN, VN, CtxLen, Bits, Out, OPart, LsePart, Counters,
    stride_qb, stride_qh, stride_qn,
    stride_kcb, stride_kch, stride_kcs,
    stride_vcb, stride_vch, stride_vcs,
    stride_knb, stride_knh, stride_kns,
    stride_vnb, stride_vnh, stride_vns,
    stride_bb, stride_bn,
    stride_ob, stride_oh, stride_on,
    N, NK, HKV, G, num_splits, qk_scale,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr,
    SPLIT: tl.constexpr, NEW_AFTER_CTX: tl.constexpr, LOWER: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, FUSED_MERGE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    pid_bh = tl.program_id(2).to(tl.int64)
    b = pid_bh // HKV
    hkv = pid_bh % HKV
    rows_total = G * N

    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [M] row = node * G + head-in-group
    node = r // G
    head = hkv * G + r % G
    row_ok = r < rows_total
    d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + head[:, None] * stride_qh + node[:, None] * stride_qn + d[None, :],
                mask=row_ok[:, None], other=0.0)  # [M, D]

    ctx_len = tl.load(CtxLen + b).to(tl.int32)
    if SPLIT:  # equal chunks of this row's own length, whole key tiles each
        chunk = tl.cdiv(tl.cdiv(ctx_len, num_splits), BLOCK_S) * BLOCK_S
        lo = split * chunk
        hi = tl.minimum(lo + chunk, ctx_len)
    else:
        lo = 0
        hi = ctx_len

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    # ---- prefix: every key visible -------------------------------------------------------------
    m_i, l_i, acc = _attend_range(q, KC + b * stride_kcb + hkv * stride_kch, VC + b * stride_vcb + hkv * stride_vch,
                                  stride_kcs, stride_vcs, lo, hi, d, m_i, l_i, acc, qk_scale, BLOCK_S, IEEE, UPCAST)

    # ---- new keys under the bitmask (the last split) --------------------------------------------
    if split == num_splits - 1:
        kn = KN + b * stride_knb + hkv * stride_knh
        vn = VN + b * stride_vnb + hkv * stride_vnh
        if NEW_AFTER_CTX:  # the target's cache: the tree's keys follow the row's prefix
            kn += ctx_len.to(tl.int64) * stride_kns
            vn += ctx_len.to(tl.int64) * stride_vns
        if LOWER:  # query i sees no key j > i: stop after this tile's last node (NK == N)
            n_hi = tl.minimum(NK, ((pid_m + 1) * BLOCK_M - 1) // G + 1)
        else:
            n_hi = NK
        bits_row = Bits + b * stride_bb + node * stride_bn  # [M]
        bit = tl.arange(0, 32)
        for start in range(0, n_hi, 32):  # one mask word per row and tile: a [M] gather, not [M, S]
            j = start + bit
            in_range = j < NK
            k = tl.load(kn + j[:, None] * stride_kns + d[None, :], mask=in_range[:, None], other=0.0)
            v = tl.load(vn + j[:, None] * stride_vns + d[None, :], mask=in_range[:, None], other=0.0)
            word = tl.load(bits_row + start // 32, mask=row_ok, other=0)
            visible = ((word[:, None] >> bit[None, :]) & 1) != 0  # [M, 32]; bits past NK are 0
            qk = _scores(q, k, qk_scale, IEEE, UPCAST)
            qk = tl.where(visible, qk, float("-inf"))
            m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, IEEE, UPCAST)

    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row that saw nothing is 0
    if not SPLIT:
        o_ptr = Out + b * stride_ob + head[:, None] * stride_oh + node[:, None] * stride_on + d[None, :]
        tl.store(o_ptr, acc.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        part = (pid_bh * num_splits + split) * rows_total + r  # [M]
        tl.store(OPart + part[:, None] * D + d[None, :], acc, mask=row_ok[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(LsePart + part, lse, mask=row_ok)
        if FUSED_MERGE:
            tl.debug_barrier()  # every thread's partial is stored before the ticket releases it
            ticket_ptr = Counters + pid_bh * tl.num_programs(0) + pid_m
            ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
            if ticket == num_splits - 1:  # the last split of this row tile: the others' partials are visible
                busy = tl.minimum(tl.cdiv(ctx_len, tl.maximum(chunk, BLOCK_S)), num_splits - 1)
                _merge_rows_of_tile(OPart, LsePart, Out, pid_bh, b, hkv, r, row_ok, d, rows_total, num_splits,
                                    busy, stride_ob, stride_oh, stride_on, G, D, BLOCK_M)
                tl.atomic_xchg(ticket_ptr, 0)  # zero again for the next launch


@triton.jit
def _merge_rows_of_tile(OPart, LsePart, Out, pid_bh, b, hkv, r, row_ok, d, rows_total, num_splits, busy,
                        stride_ob, stride_oh, stride_on, G, D: tl.constexpr, BLOCK_M: tl.constexpr):
    """Merge rows r of splits [0, busy) and the last split (the new keys) in split order (busy = splits - 1:
    all of them). In the fused merge the splits left out hold no key (their log-sum-exp is -inf), and
    leaving them out changes no bit. Loads bypass L1 (.cg): the partials were written by other programs."""
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    wsum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for i in range(0, busy + 1):
        s = tl.where(i == busy, num_splits - 1, i)
        part = (pid_bh * num_splits + s) * rows_total + r
        lse = tl.load(LsePart + part, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(OPart + part[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        w = tl.exp2(lse - m_safe)
        acc = acc * alpha[:, None] + w[:, None] * o
        wsum = wsum * alpha + w
        m = m_new
    acc = acc / tl.where(wsum > 0, wsum, 1.0)[:, None]
    node = r // G
    head = hkv * G + r % G
    o_ptr = Out + b * stride_ob + head[:, None] * stride_oh + node[:, None] * stride_on + d[None, :]
    tl.store(o_ptr, acc.to(Out.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _merge_splits_kernel(
    OPart, LsePart, Out,
    stride_ob, stride_oh, stride_on,
    N, HKV, G, num_splits,
    D: tl.constexpr, BLOCK_R: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // HKV
    hkv = pid_bh % HKV
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    _merge_rows_of_tile(OPart, LsePart, Out, pid_bh, b, hkv, r, r < G * N, tl.arange(0, D), G * N, num_splits,
                        num_splits - 1, stride_ob, stride_oh, stride_on, G, D, BLOCK_R)


@dataclass(frozen=True)
class AttentionConfig:
    """Launch shape: rows (heads x nodes) per program, keys per tile, warps, pipeline depth, splits, and
    whether the last split of a tile merges them (used only where the caller passes `split_counters`)."""

    block_m: int
    block_s: int
    num_warps: int
    num_stages: int
    num_splits: int
    fused_merge: bool = False


def plan_attention(batch: int, kv_heads: int, group: int, n: int, context_hint: int, device: torch.device,
                   dtype: torch.dtype = torch.bfloat16) -> AttentionConfig:
    """Explicit launch configs by (dtype, rows = group x N); split the prefix until ~2 programs per SM,
    with at least one key tile per split (a decode step of a few heads is latency-bound: the more
    programs stream the prefix at once, the sooner it is read)."""
    rows = group * n
    if dtype == torch.float32:  # exact fp32 dots run on FMA units: small tiles keep compile time low
        block_m, block_s, warps, stages = 16, 32, 4, 1
    elif rows <= 16:
        block_m, block_s, warps, stages = 16, 64, 4, 3
    else:  # 64-row tiles, 4 warps, also past 64 rows: on an H200, over the engine's whole cache, SmolLM2's
        # 65-node verify ran 8.0 us a layer against 9.5 for 128-row tiles of 8 warps, Qwen3-8B's 17-node
        # one 12.9 against 14.5 (scripts/bench_attention_plan.py; docs/measurements/README.md)
        block_m, block_s, warps, stages = 64, 64, 4, 3
    base = batch * kv_heads * triton.cdiv(rows, block_m)
    want = triton.cdiv(2 * num_sms(device), base)
    splits = max(1, min(want, context_hint // (4 * block_s), 64))  # at least four key tiles per split
    return AttentionConfig(block_m, block_s, warps, stages, splits, fused_merge=n <= FUSED_MERGE_MAX_NODES)


def _check(q: Tensor, tensors: dict[str, Tensor], ctx_lengths: Tensor, mask_bits: Tensor, num_new: int) -> None:
    if q.dim() != 4:
        raise ValueError(f"q must be [B, H, N, D], got {tuple(q.shape)}")
    b, h, n, d = q.shape
    if q.dtype not in DTYPES:
        raise ValueError(f"dtype {q.dtype} is not supported; use one of {DTYPES}")
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim {d} is not supported; supported: {HEAD_DIMS}")
    require_kernel_device(q)
    for name, t in tensors.items():
        if t.dim() != 4 or t.shape[0] != b or t.shape[3] != d:
            raise ValueError(f"{name} must be [B={b}, Hkv, S, D={d}], got {tuple(t.shape)}")
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}; q is {q.dtype} on {q.device}: they must match")
        if t.stride(3) != 1:
            raise ValueError(f"{name} must be contiguous in the head dim (stride 1), got strides {t.stride()}")
        if t.shape[1] != tensors["ctx_k"].shape[1]:
            raise ValueError(f"{name} has {t.shape[1]} KV heads, ctx_k has {tensors['ctx_k'].shape[1]}")
    hkv = tensors["ctx_k"].shape[1]
    if h % hkv:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({hkv})")
    if ctx_lengths.shape != (b,) or ctx_lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lengths must be an int32/int64 tensor [B={b}], got {ctx_lengths.dtype} {tuple(ctx_lengths.shape)}")
    if mask_bits.dtype != torch.int32 or mask_bits.dim() != 3 or mask_bits.shape[:2] != (b, n) \
            or mask_bits.shape[2] < num_words(num_new) or mask_bits.stride(2) != 1:
        raise ValueError(f"the mask must be packed int32 [B={b}, N={n}, >= {num_words(num_new)}] (pack_tree_mask), "
                         f"got {mask_bits.dtype} {tuple(mask_bits.shape)}")
    if ctx_lengths.device != q.device or mask_bits.device != q.device:
        raise ValueError("lengths and mask must be on q's device")


def context_attention(q: Tensor, ctx_k: Tensor, ctx_v: Tensor, ctx_lengths: Tensor, new_k: Tensor, new_v: Tensor,
                      mask_bits: Tensor, scale: float, *, new_after_context: bool = False,
                      lower_triangular: bool = False, context_hint: int | None = None, num_new: int | None = None,
                      config: AttentionConfig | None = None, out: Tensor | None = None,
                      split_counters: Tensor | None = None) -> Tensor:
    """Attention of N new queries over a visible prefix plus NK masked new keys (NK = `num_new`, default N:
    a tree's nodes; more than N when the queries are the last few of the new entries, e.g. one depth of a
    draft tree attending to every node drafted so far).

    q [B, H, N, D]; ctx_k/ctx_v [B, Hkv, S_ctx, D] (row b's prefix = slots [0, ctx_lengths[b]));
    new_k/new_v [B, Hkv, S_new, D]: new key j at slot j, or at ctx_lengths[b] + j when
    `new_after_context` (the target's cache, passed as both ctx and new); mask_bits [B, N, W] int32
    from `pack_tree_mask` (query i sees new key j < NK iff bit j of row i). `lower_triangular` promises
    that no query sees a later new key (tree and causal masks; needs NK = N), so those tiles are skipped.
    `context_hint` >= max prefix length (host int) sizes the split; it never affects results.
    `split_counters`: an int32 workspace of zeros on q's device, kept by the caller across calls that run
    in stream order (never two at once on one workspace); with it a split config whose `fused_merge` is
    set merges in the attention kernel, and the counters are zero again when the call ends. Too small for
    the launch (B x Hkv x row tiles), or absent: the merge kernel.
    Returns [B, H, N, D] in q's dtype (into `out` if given). A row that sees no key at all is 0.
    """
    n = q.shape[2]
    nk = n if num_new is None else num_new
    _check(q, {"ctx_k": ctx_k, "ctx_v": ctx_v, "new_k": new_k, "new_v": new_v}, ctx_lengths, mask_bits, nk)
    b, h, n, d = q.shape
    hkv = ctx_k.shape[1]
    group = h // hkv
    if lower_triangular and nk != n:
        raise ValueError(f"lower_triangular needs as many new keys as queries, got {nk} for {n}")
    if not new_after_context and new_k.shape[2] < nk:
        raise ValueError(f"new_k has {new_k.shape[2]} slots for {nk} new keys")
    if q.stride(3) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty(b, n, h, d, dtype=q.dtype, device=q.device).transpose(1, 2)  # [B, H, N, D] view
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(3) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype} with stride 1 in the head dim")
    if context_hint is None:
        context_hint = ctx_k.shape[2] - (n if new_after_context else 0)
    cfg = config or plan_attention(b, hkv, group, n, context_hint, q.device, q.dtype)
    rows = group * n
    tiles = triton.cdiv(rows, cfg.block_m)
    if cfg.num_splits > 1:
        o_part = torch.empty(b * hkv, cfg.num_splits, rows, d, dtype=torch.float32, device=q.device)
        lse_part = torch.empty(b * hkv, cfg.num_splits, rows, dtype=torch.float32, device=q.device)
    else:
        o_part = lse_part = out  # unused
    fused = cfg.num_splits > 1 and cfg.fused_merge and split_counters is not None \
        and split_counters.numel() >= b * hkv * tiles
    if fused and (split_counters.dtype != torch.int32 or split_counters.device != q.device):
        raise ValueError(f"split_counters must be int32 on {q.device}, got {split_counters.dtype} on "
                         f"{split_counters.device}")
    ieee = q.dtype == torch.float32
    upcast = interpreting() and q.dtype == torch.bfloat16
    _attention_kernel[(tiles, cfg.num_splits, b * hkv)](
        q, ctx_k, ctx_v, new_k, new_v, ctx_lengths, mask_bits, out, o_part, lse_part,
        split_counters if fused else lse_part,
        q.stride(0), q.stride(1), q.stride(2),
        ctx_k.stride(0), ctx_k.stride(1), ctx_k.stride(2),
        ctx_v.stride(0), ctx_v.stride(1), ctx_v.stride(2),
        new_k.stride(0), new_k.stride(1), new_k.stride(2),
        new_v.stride(0), new_v.stride(1), new_v.stride(2),
        mask_bits.stride(0), mask_bits.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        n, nk, hkv, group, cfg.num_splits, scale * LOG2E,
        D=d, BLOCK_M=cfg.block_m, BLOCK_S=cfg.block_s, SPLIT=cfg.num_splits > 1,
        NEW_AFTER_CTX=new_after_context, LOWER=lower_triangular, IEEE=ieee, UPCAST=upcast, FUSED_MERGE=fused,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if cfg.num_splits > 1 and not fused:
        block_r = _merge_rows(b * hkv, rows, q.device)
        _merge_splits_kernel[(triton.cdiv(rows, block_r), b * hkv)](
            o_part, lse_part, out, out.stride(0), out.stride(1), out.stride(2), n, hkv, group, cfg.num_splits,
            D=d, BLOCK_R=block_r, num_warps=4,
        )
    return out


def _merge_rows(bh: int, rows: int, device: torch.device) -> int:
    """Rows per merge program: the largest that still gives ~2 programs per SM."""
    for block_r in (64, 32, 16):
        if bh * triton.cdiv(rows, block_r) >= 2 * num_sms(device):
            return block_r
    return 8


def tree_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, lengths: Tensor, tree_bits: Tensor, scale: float,
                   *, kv_len: int | None = None, config: AttentionConfig | None = None,
                   out: Tensor | None = None, split_counters: Tensor | None = None,
                   fused_merge: bool | None = None) -> Tensor:
    """The target's verification attention. q [B, H, N, D]; k_cache/v_cache [B, Hkv, S, D] with the N
    tree keys already written at slots [lengths[b], lengths[b] + N); tree_bits [B, N, W] = the packed
    ancestor mask (parents precede children, so it is lower triangular). `kv_len` (host int, >=
    max(lengths) + N) only sizes the split; `split_counters` as in `context_attention`; `fused_merge` (without
    `config`) overrides the plan's choice of where the splits merge (None: fused up to `FUSED_MERGE_MAX_NODES` nodes).
    Returns [B, H, N, D]."""
    n = q.shape[2]
    hint = (kv_len if kv_len is not None else k_cache.shape[2]) - n
    if config is None and fused_merge is not None:
        b, h, _, _ = q.shape
        hkv = k_cache.shape[1]
        config = dataclasses.replace(plan_attention(b, hkv, h // hkv, n, max(hint, 0), q.device, q.dtype),
                                     fused_merge=fused_merge)
    return context_attention(q, k_cache, v_cache, lengths, k_cache, v_cache, tree_bits, scale,
                             new_after_context=True, lower_triangular=True, context_hint=max(hint, 0),
                             config=config, out=out, split_counters=split_counters)


def attention_bytes(batch: int, kv_heads: int, context: int, n: int, head_dim: int, elem: int) -> int:
    """Bytes of K/V the kernel must read: prefix + new keys, K and V."""
    return 2 * batch * kv_heads * (context + n) * head_dim * elem


def attention_flops(batch: int, heads: int, context: int, n: int, head_dim: int) -> int:
    """Matrix FLOPs of the full (unskipped) score and value products."""
    return 4 * batch * heads * n * (context + n) * head_dim


__all__ = ["AttentionConfig", "plan_attention", "tree_attention", "context_attention", "attention_bytes",
           "attention_flops"]
