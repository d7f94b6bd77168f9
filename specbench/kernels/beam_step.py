"""One depth of EAGLE-2's beam expansion after the frontier's top-k, in one launch (`trees.grow.beam_grow`).

Given the frontier's F beams (scores [F]) and each beam's k ranked children (tokens and log-probs [F, k]), the
tensor ops write the F*k candidates' tokens and cumulative scores into the tree's buffers, choose the next
beams (the `width` best candidates by score, equal scores by lower place: a stable descending sort) and
write their ids as the parents of the next depth's children: a clamp, two adds, a copy, a sort and an index,
six kernels a depth, each a ~3-5 us graph node on the GPU round. Here one program does all of it (F*k is at
most a few hundred): the scores as the ops compute them (beam score + min(log-prob, 0), in fp32), the next
beams by the same packed keys as the ranked top-k (`top_b_tree._order_key`: score desc, place asc).
Reference: `trees.grow.beam_step_ops`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device
from specbench.kernels.top_b_tree import _best, _order_key

MAX_CANDIDATES = 8192  # F * k one program holds


@triton.jit
def _beam_step_kernel(Tok, Lp, Beam, OutTok, OutScore, NextPar, NextBeam, FK, K, W, COUNT, stride_tok, stride_lp,
                      E_PAD: tl.constexpr, W_PAD: tl.constexpr, K_PAD: tl.constexpr, HAS_NEXT: tl.constexpr,
                      USE_TOPK: tl.constexpr):
    e = tl.arange(0, E_PAD)  # candidate place in this depth's block: beam e // K, rank e % K
    ok = e < FK
    f, c = e // K, e % K
    lp = tl.load(Lp + f * stride_lp + c, mask=ok, other=0.0).to(tl.float32)
    cand = tl.load(Beam + f, mask=ok, other=0.0) + tl.minimum(lp, 0.0)  # [E_PAD]
    tl.store(OutScore + e, cand, mask=ok)
    tl.store(OutTok + e, tl.load(Tok + f * stride_tok + c, mask=ok), mask=ok)
    if HAS_NEXT:
        keys = tl.where(ok, _order_key(cand, e), tl.full([E_PAD], -9223372036854775808, tl.int64))
        best = _best(keys, W_PAD, USE_TOPK)  # [W_PAD] (or [E_PAD] sorted), descending
        j = tl.arange(0, best.shape[0])
        take = j < W
        place = (0xFFFFFFFF - (best & 0xFFFFFFFF)).to(tl.int32)
        place = tl.where(take, place, 0)
        bf, bc = place // K, place % K  # the chosen candidate's score again, from the inputs (no barrier)
        blp = tl.load(Lp + bf * stride_lp + bc, mask=take, other=0.0).to(tl.float32)
        tl.store(NextBeam + j, tl.load(Beam + bf, mask=take, other=0.0) + tl.minimum(blp, 0.0), mask=take)
        kk = tl.arange(0, K_PAD)
        ids = tl.broadcast_to((place + COUNT).to(tl.int64)[:, None], (best.shape[0], K_PAD))  # each beam's id, k times
        tl.store(NextPar + j[:, None] * K + kk[None, :], ids,
                 mask=take[:, None] & (kk < K)[None, :])


def beam_step(tok: Tensor, lp: Tensor, beam_scores: Tensor, out_tokens: Tensor, out_scores: Tensor,
              next_parents: Tensor | None, count: int, width: int) -> Tensor | None:
    """tok [F, k] int64 and lp [F, k] float children of beams scored beam_scores [F] float32: writes the F*k
    tokens to out_tokens [F*k] and their scores beam + min(lp, 0) to out_scores [F*k] (by beam, then rank);
    with `next_parents` ([W*k], W = min(width, F*k)), the W best candidates (score desc, place asc) become the
    next beams: each one's id (count + place) is written k times there, and their scores are returned [W]."""
    require_kernel_device(tok)
    f, k = tok.shape
    fk = f * k
    if lp.shape != (f, k) or beam_scores.shape != (f,) or out_tokens.shape != (fk,) or out_scores.shape != (fk,):
        raise ValueError(f"beam_step: tok {tuple(tok.shape)}, lp {tuple(lp.shape)}, beams {tuple(beam_scores.shape)}, "
                         f"outputs {tuple(out_tokens.shape)} / {tuple(out_scores.shape)} do not match")
    if not 1 <= fk <= MAX_CANDIDATES or width < 1:
        raise ValueError(f"beam_step takes 1..{MAX_CANDIDATES} candidates and width >= 1; got {fk}, width {width}")
    if tok.stride(-1) != 1 or lp.stride(-1) != 1:
        tok, lp = tok.contiguous(), lp.contiguous()
    w = min(width, fk)
    has_next = next_parents is not None
    if has_next and next_parents.shape != (w * k,):  # type: ignore[union-attr]
        raise ValueError(f"next_parents must be [{w * k}], got {tuple(next_parents.shape)}")  # type: ignore[union-attr]
    next_beam = torch.empty(w, dtype=torch.float32, device=tok.device) if has_next else out_scores
    e_pad = max(2, triton.next_power_of_2(fk))
    _beam_step_kernel[(1,)](tok, lp, beam_scores, out_tokens, out_scores,
                            next_parents if has_next else out_tokens, next_beam, fk, k, w, count,
                            tok.stride(0), lp.stride(0), E_PAD=e_pad, W_PAD=max(2, triton.next_power_of_2(w)),
                            K_PAD=max(2, triton.next_power_of_2(k)), HAS_NEXT=has_next,
                            USE_TOPK=hasattr(tl, "topk"), num_warps=4 if e_pad <= 1024 else 8)
    return next_beam if has_next else None
