"""Tree acceptance (greedy walk) on the GPU, one program per batch row, no host sync inside.

Same result as the greedy walk (verify/walk.py): from the root, descend into the first child (lowest
id) whose token equals the node's pick; the pick at the stop is the bonus token. Nodes other than the
root with parent -1 are inert padding (a tree padded to a static size): never accepted. The pick of a node
is the target's token there: its argmax (greedy), or its sample (sample-walk) drawn beforehand.

  1. match[i]  = token[i] == pick[parent[i]]              (root: always)
  2. keep only the first matched child of each parent     (atomic min per parent): the walk never
     enters a later duplicate sibling, and now the matched nodes form at most one chain per node
  3. pointer doubling, log2(N) rounds: ok[i] &= ok[anc[i]]; depth[i] += depth[anc[i]]; anc[i] = anc[anc[i]]
     -> ok[i] = every node root..i matched, depth[i] = depth of i
  4. the ok nodes are exactly the accepted path; P = 1 + max depth; path[depth[i]] = i.

Output, packed in one int64 tensor so the caller reads everything with one `.tolist()`:
[P, bonus, path[0..P), -1 ...] per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device

MAX_NODES = 1024


@triton.jit
def _tree_accept_kernel(Tok, Par, Pick, Scratch, Out, N,
                        stride_t, stride_p, stride_k, stride_s, stride_o,
                        BLOCK: tl.constexpr, ROUNDS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    tok_row, par_row, pick_row = Tok + row * stride_t, Par + row * stride_p, Pick + row * stride_k
    first = Scratch + row * stride_s  # [BLOCK] first matched child of each parent
    anc_buf, ok_buf, dep_buf = first + BLOCK, first + 2 * BLOCK, first + 3 * BLOCK
    out = Out + row * stride_o

    i = tl.arange(0, BLOCK)
    valid = i < N
    tok = tl.load(tok_row + i, mask=valid, other=-1)
    par = tl.load(par_row + i, mask=valid, other=-1).to(tl.int32)
    has_par = valid & (par >= 0)
    parent_pick = tl.load(pick_row + par, mask=has_par, other=-1)
    match = valid & ((i == 0) | (has_par & (tok == parent_pick)))  # other parentless nodes: inert padding

    # keep the first matched child of each parent (scratch is read volatile: it bypasses L1)
    tl.store(first + i, BLOCK)
    tl.debug_barrier()
    tl.atomic_min(first + par, i, mask=match & has_par)
    tl.debug_barrier()
    first_child = tl.load(first + par, mask=has_par, other=-1, volatile=True)
    match = match & ((par < 0) | (first_child == i))

    anc = tl.where(has_par, par, -1)
    ok = match.to(tl.int32)
    dep = has_par.to(tl.int32)
    for _ in tl.static_range(ROUNDS):
        tl.store(anc_buf + i, anc)
        tl.store(ok_buf + i, ok)
        tl.store(dep_buf + i, dep)
        tl.debug_barrier()
        up = anc >= 0
        up_anc = tl.load(anc_buf + anc, mask=up, other=-1, volatile=True)
        up_ok = tl.load(ok_buf + anc, mask=up, other=1, volatile=True)
        up_dep = tl.load(dep_buf + anc, mask=up, other=0, volatile=True)
        tl.debug_barrier()
        ok = ok & up_ok
        dep = dep + up_dep
        anc = up_anc

    accepted = ok != 0
    deepest = tl.max(tl.where(accepted, dep, -1), 0)
    best = tl.min(tl.where(accepted & (dep == deepest), i, BLOCK), 0)  # unique; min keeps it a scalar
    bonus = tl.load(pick_row + best)
    tl.store(out + 2 + dep, i.to(tl.int64), mask=accepted)
    tl.store(out + 2 + i, tl.full([BLOCK], -1, tl.int64), mask=valid & (i > deepest))
    tl.store(out, (deepest + 1).to(tl.int64))
    tl.store(out + 1, bonus.to(tl.int64))


@dataclass
class AcceptResult:
    """Views of one packed int64 buffer; `packed.tolist()` is the caller's single host sync."""

    packed: Tensor  # [B, 2 + N] (or [2 + N])
    length: Tensor  # [B] accepted path length P (root included)
    bonus: Tensor  # [B] the pick at the last accepted node
    path: Tensor  # [B, N] node ids root..node, then -1


def tree_accept(tokens: Tensor, parents: Tensor, picks: Tensor | None = None, *,
                logits: Tensor | None = None) -> AcceptResult:
    """Tree acceptance. tokens, parents [N] or [B, N] (parents[0] = -1, parents[i] < i; -1 elsewhere = padding);
    picks [N] / [B, N] = the target's token at each node (argmax, or a pre-drawn sample), or pass
    `logits` [.., N, V] for greedy and the argmax is taken here (first maximum, like torch.argmax).
    N <= 1024."""
    if (picks is None) == (logits is None):
        raise ValueError("pass exactly one of picks and logits")
    if picks is None:
        picks = logits.argmax(dim=-1)  # type: ignore[union-attr]
    squeeze = tokens.dim() == 1
    tok, par, pick = (t.reshape(-1, t.shape[-1]) if t.dim() == 1 else t for t in (tokens, parents, picks))
    if tok.dim() != 2 or tok.shape != par.shape or tok.shape != pick.shape:
        raise ValueError(f"tokens, parents and picks must all be [N] or [B, N]; got {tuple(tokens.shape)}, "
                         f"{tuple(parents.shape)}, {tuple(picks.shape)}")
    b, n = tok.shape
    if not 1 <= n <= MAX_NODES:
        raise ValueError(f"tree_accept handles 1..{MAX_NODES} nodes, got {n}: use the reference walk for larger trees")
    require_kernel_device(tok)
    tok, par, pick = tok.contiguous(), par.contiguous(), pick.contiguous()
    block = max(16, triton.next_power_of_2(n))
    scratch = torch.empty(b, 4 * block, dtype=torch.int32, device=tok.device)
    packed = torch.empty(b, 2 + n, dtype=torch.int64, device=tok.device)
    _tree_accept_kernel[(b,)](tok, par, pick, scratch, packed, n,
                              tok.stride(0), par.stride(0), pick.stride(0), scratch.stride(0), packed.stride(0),
                              BLOCK=block, ROUNDS=block.bit_length() - 1, num_warps=4 if block <= 256 else 8)
    if squeeze:
        packed = packed[0]
    return AcceptResult(packed=packed, length=packed[..., 0], bonus=packed[..., 1], path=packed[..., 2:])
