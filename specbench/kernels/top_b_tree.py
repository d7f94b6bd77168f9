"""The top-B draft tree (DDTree's optimal tree over per-depth scores) in one Triton program.

The tensor-op builder (`specbench.trees.ddtree_vec.build_top_b`, the reference: tests check that both
return identical trees) launches ~10 small kernels per depth; on a launch-bound GPU round that costs
more than the head pass it builds from. Here one program keeps every step on chip:

  beam(0) = [the root, score 0]
  for depth d: candidates = pairs (beam place i, rank r) with (i+1)(r+1) <= B (no other child can be
               among the best B), score = beam[i] + lp[d, r]; beam(d) = the best min(B, #pairs), by
               (score desc, (place, rank) asc), via one sort of packed int64 keys
  tree = the best B entries of all beams by (score desc, depth asc, place asc), in that order; a
         node's parent is the tree position of its beam parent.

Inputs: lp, tokens [D, K] ranked per depth (log-probs, clamped at 0 as they load; K = min(B, V)), the
anchor [1] (device), B. The candidate pairs' (place, rank) table depends only on B (`pair_table`).
Each depth's beam stays on chip (`tl.gather` reads a pair's beam score and the chosen candidates' fields);
the beams are written to global memory only for the final pick, read after one barrier. `batch`
builds B trees in one launch, one program per tree (JetSpec++'s foresight builds 16 a round).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device

LOW32 = 0xFFFFFFFF


@triton.jit
def _order_key(score, idx):
    """int64 key whose descending order is (score desc, idx asc); score float32, idx int32 >= 0."""
    bits = (score + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 sorts as +0.0
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0xFFFFFFFF - idx.to(tl.int64))


@triton.jit
def _best(keys, KP: tl.constexpr, USE_TOPK: tl.constexpr):
    """The KP largest of `keys` [N] (unique int64) in descending order, first in what it returns:
    `tl.topk` keeps only them ([KP], a partial bitonic network), `tl.sort` sorts all N."""
    if USE_TOPK:
        best = tl.topk(keys, KP)
    else:
        best = tl.sort(keys, 0, descending=True)
    return best


@triton.jit
def _beam_scores(score, first, B_PAD: tl.constexpr):
    """The new beam's scores as a [B_PAD] tensor: `score` is [B_PAD] from `tl.topk`, or [M_PAD] (>= B_PAD)
    from `tl.sort`, whose first B_PAD entries hold the beam."""
    if score.shape[0] == B_PAD:
        return tl.where(first, score, 0.0)
    keep = tl.arange(0, score.shape[0]) < B_PAD
    return tl.reshape(tl.where(first & keep, score, 0.0), [score.shape[0] // B_PAD, B_PAD]).sum(axis=0)


@triton.jit
def _top_b_tree_kernel(LP, Tok, Anchor, PairPlace, PairRank, BeamScore, BeamParent, BeamRank,
                       BeamCount, NodeOf, OutTok, OutPar, OutDep, OutScore,
                       D, K, M, NODES, stride_lp, stride_tok, stride_lp_tree, stride_tok_tree,
                       B: tl.constexpr, M_PAD: tl.constexpr, T_PAD: tl.constexpr, B_PAD: tl.constexpr,
                       N_PAD: tl.constexpr, USE_TOPK: tl.constexpr):
    tree = tl.program_id(0).to(tl.int64)  # one program per tree: its table, anchor, scratch and outputs
    LP += tree * stride_lp_tree
    Tok += tree * stride_tok_tree
    Anchor += tree
    BeamScore += tree * D * B
    BeamParent += tree * D * B
    BeamRank += tree * D * B
    BeamCount += tree * D
    NodeOf += tree * D * B
    OutTok += tree * (NODES + 1)
    OutPar += tree * (NODES + 1)
    OutDep += tree * (NODES + 1)
    OutScore += tree * (NODES + 1)
    m = tl.arange(0, M_PAD)
    pair_ok = m < M
    place = tl.load(PairPlace + m, mask=pair_ok, other=0)
    rank = tl.load(PairRank + m, mask=pair_ok, other=0)
    lowest = tl.full([M_PAD], -9223372036854775808, tl.int64)
    beam = tl.zeros([B_PAD], dtype=tl.float32)  # the last beam's scores, on chip (the root's: 0)
    beam_size = 1  # the root
    for d in range(0, D):
        valid = pair_ok & (place < beam_size) & (rank < K)
        prev = tl.gather(beam, tl.where(valid, place, 0), 0)  # [M_PAD] the pair's beam entry's score
        lp = tl.load(LP + d * stride_lp + rank, mask=valid, other=0.0).to(tl.float32)
        lp = tl.minimum(lp, 0.0, propagate_nan=tl.PropagateNan.ALL)  # the reference's clamp at 0 (NaN stays NaN)
        cand = prev + lp  # float32, as the reference adds
        best = _best(tl.where(valid, _order_key(cand, m), lowest), B_PAD, USE_TOPK)  # [B_PAD] (or [M_PAD])
        j = tl.arange(0, best.shape[0])
        idx = (0xFFFFFFFF - (best & 0xFFFFFFFF)).to(tl.int32)  # candidate index, in beam order
        count = tl.minimum(tl.sum(valid.to(tl.int32), 0), B)
        first = j < count
        src = tl.where(first, idx, 0)
        score = tl.gather(cand, src, 0)  # [B_PAD] (or [M_PAD]): the new beam, gathered on chip
        tl.store(BeamScore + d * B + j, score, mask=first)  # kept for the final pick (read after one barrier)
        tl.store(BeamParent + d * B + j, tl.gather(place, src, 0), mask=first)
        tl.store(BeamRank + d * B + j, tl.gather(rank, src, 0), mask=first)
        tl.store(BeamCount + d, count)
        beam = _beam_scores(score, first, B_PAD)
        beam_size = count
    tl.debug_barrier()
    # the best NODES of all beams: (score desc, depth asc, place asc) = entry index d * B + place asc
    t = tl.arange(0, T_PAD)
    entry_d = t // B
    entry_place = t % B
    in_range = t < D * B
    count_d = tl.load(BeamCount + entry_d, mask=in_range, other=0, volatile=True)
    used = in_range & (entry_place < count_d)
    escore = tl.load(BeamScore + t, mask=used, other=0.0, volatile=True)
    best = _best(tl.where(used, _order_key(escore, t), tl.full([T_PAD], -9223372036854775808, tl.int64)), N_PAD,
                 USE_TOPK)
    chosen = (0xFFFFFFFF - (best & 0xFFFFFFFF)).to(tl.int32)  # [N_PAD] (or [T_PAD]) entry index, in tree order
    u = tl.arange(0, best.shape[0])
    take = u < NODES
    tl.store(NodeOf + chosen, u + 1, mask=take)  # entry -> node id (the root is node 0)
    tl.debug_barrier()
    cd = chosen // B
    parent_place = tl.load(BeamParent + chosen, mask=take, other=0)
    parent_node = tl.load(NodeOf + (cd - 1) * B + parent_place, mask=take & (cd > 0), other=0, volatile=True)
    r = tl.load(BeamRank + chosen, mask=take, other=0)
    tl.store(OutTok + 1 + u, tl.load(Tok + cd * stride_tok + r, mask=take, other=0), mask=take)
    tl.store(OutPar + 1 + u, parent_node.to(tl.int64), mask=take)
    tl.store(OutDep + 1 + u, (cd + 1).to(tl.int64), mask=take)
    tl.store(OutScore + 1 + u, tl.load(BeamScore + chosen, mask=take, other=0.0), mask=take)
    tl.store(OutTok, tl.load(Anchor))
    tl.store(OutPar, -1)
    tl.store(OutDep, 0)
    tl.store(OutScore, 0.0)


def pair_table(budget: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(place, rank) of every pair with (place+1)(rank+1) <= budget and rank < width, lexicographic."""
    places, ranks = [], []
    for i in range(budget):
        r = min(width, budget // (i + 1))
        places.append(np.full(r, i))
        ranks.append(np.arange(r))
    return np.concatenate(places), np.concatenate(ranks)


def tree_size(depth: int, width: int, budget: int) -> int:
    """Nodes below the root of the top-`budget` tree over a [depth, width] table (shapes only)."""
    total, beam = 0, 1
    for _ in range(depth):
        pairs = sum(min(width, budget // (i + 1)) for i in range(beam))
        beam = min(budget, pairs)
        total += beam
    return min(budget, total)


class TopBTree:
    """The kernel with its pair table and scratch allocated once per (budget, width, device)."""

    def __init__(self, budget: int, width: int, device: torch.device, use_topk: bool | None = None,
                 num_warps: int | None = None) -> None:
        if budget < 1 or width < 1:
            raise ValueError(f"budget and width must be >= 1, got {budget}, {width}")
        self.budget, self.width = budget, min(width, budget)
        place, rank = pair_table(budget, self.width)
        self.place = torch.from_numpy(place).to(device=device, dtype=torch.int32)
        self.rank = torch.from_numpy(rank).to(device=device, dtype=torch.int32)
        self.m_pad = triton.next_power_of_2(max(len(place), 2))
        self.use_topk = hasattr(tl, "topk") if use_topk is None else use_topk  # keep only the best, not sort all
        # None: 8 warps once the pair table has 512 or more slots (B >= ~40: ddtree/64's 303 pairs), else 4. On the
        # H200 (scripts/bench_top_b_tree.py, 2026-12-03) B = 64 took 52.8 us at 4 warps, 40.9 at 8, 44.8 at 16;
        # B = 16 16.7 us at 4, 17.8 at 8
        self.num_warps = num_warps or (8 if self.m_pad >= 512 else 4)

    def __call__(self, anchor: Tensor, tokens: Tensor, logp: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """anchor [1], tokens/logp [D, K] -> (tokens, parents, depth [N] int64, scores [N] float32)."""
        if logp.dim() != 2:
            raise ValueError(f"the table must be [D, K], got {tuple(logp.shape)} (a batch of tables: `batch`)")
        out = self.batch(anchor.reshape(1), tokens[None], logp[None])
        return out[0][0], out[1][0], out[2][0], out[3][0]

    def batch(self, anchors: Tensor, tokens: Tensor, logp: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """B trees in one launch (one program each): anchors [B], tokens/logp [B, D, K] -> (tokens, parents,
        depth [B, N] int64, scores [B, N] float32)."""
        require_kernel_device(logp)
        trees, depth, width = logp.shape
        if width > self.width or tokens.shape != logp.shape or depth < 1 or anchors.shape != (trees,):
            raise ValueError(f"the tables must be [B, D >= 1, <= {self.width}] with B anchors, got {tuple(logp.shape)}, "
                             f"{tuple(tokens.shape)} and {tuple(anchors.shape)}")
        # the kernel clamps at 0 as it loads (no launch of its own); it reads float32 rows with unit stride
        lp = logp if logp.dtype == torch.float32 and logp.stride(-1) == 1 else logp.float().contiguous()
        tok, anchors = tokens.contiguous(), anchors.contiguous()
        dev, b = logp.device, self.budget
        i32 = dict(dtype=torch.int32, device=dev)
        beam_score = torch.empty(trees, depth * b, dtype=torch.float32, device=dev)
        beam_parent, beam_rank = torch.empty(trees, depth * b, **i32), torch.empty(trees, depth * b, **i32)
        beam_count, node_of = torch.empty(trees, depth, **i32), torch.empty(trees, depth * b, **i32)
        nodes = tree_size(depth, width, b)
        out_tok, out_par, out_dep = (torch.empty(trees, 1 + nodes, dtype=torch.long, device=dev) for _ in range(3))
        out_score = torch.empty(trees, 1 + nodes, dtype=torch.float32, device=dev)
        t_pad = triton.next_power_of_2(max(depth * b, 2))
        _top_b_tree_kernel[(trees,)](lp, tok, anchors, self.place, self.rank, beam_score, beam_parent, beam_rank,
                                     beam_count, node_of, out_tok, out_par, out_dep, out_score,
                                     depth, width, self.place.numel(), nodes, lp.stride(1), tok.stride(1),
                                     lp.stride(0), tok.stride(0),
                                     B=b, M_PAD=self.m_pad, T_PAD=t_pad,
                                     B_PAD=min(self.m_pad, max(2, triton.next_power_of_2(b))),
                                     N_PAD=min(t_pad, max(2, triton.next_power_of_2(nodes))), USE_TOPK=self.use_topk,
                                     num_warps=self.num_warps)
        return out_tok, out_par, out_dep, out_score
