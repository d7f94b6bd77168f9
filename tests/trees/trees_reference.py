"""Brute-force references and hypothesis strategies for the tree tests: plain Python over small tables, written from the
documented rules (specbench.trees docstring), sharing no code with the builders."""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

import hypothesis.strategies as st
import networkx as nx
import numpy as np
import torch

from specbench.trees.base import DepthScores, DraftTree


def f32(x: float) -> float:
    return float(np.float32(x))


def ranked_ids(row: Sequence[float]) -> list[int]:
    """Token ids by descending float32 log-prob, ties lower id first."""
    vals = [f32(v) for v in row]
    return sorted(range(len(vals)), key=lambda i: (-vals[i], i))


def ranked_table(logp: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
    """Per row: ranked token ids and their log-probs clamped at 0 (float32 values as floats)."""
    ids, vals = [], []
    for row in logp.float().tolist():
        order = ranked_ids(row)
        ids.append(order)
        vals.append([min(f32(row[i]), 0.0) for i in order])
    return ids, vals


def top_b(logp: torch.Tensor, budget: int) -> list[tuple[tuple[int, ...], float, int]]:
    """The optimal top-B nodes in the documented global order, by enumerating every prefix of ranks
    < min(B, V) up to depth min(D, B): (token path, score, parent index in this list or -1)."""
    ids, lp = ranked_table(logp)
    depth, width = min(len(ids), budget), min(budget, logp.shape[-1])
    levels = []  # per depth: [(score, parent place, rank)] sorted in the within-depth order
    previous = [0.0]
    for d in range(depth):
        cands = [(f32(ps + lp[d][r]), place, r) for place, ps in enumerate(previous) for r in range(width)]
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        levels.append(cands)
        previous = [c[0] for c in cands]
    everything = [(c[0], d, pos) for d, level in enumerate(levels) for pos, c in enumerate(level)]
    everything.sort(key=lambda e: (-e[0], e[1], e[2]))
    chosen = everything[:budget]
    index = {(d, pos): i for i, (_, d, pos) in enumerate(chosen)}
    paths: dict[tuple[int, int], tuple[int, ...]] = {}
    out = []
    for score, d, pos in chosen:
        _, parent_place, rank = levels[d][pos]
        parent_path = paths[(d - 1, parent_place)] if d else ()
        paths[(d, pos)] = parent_path + (ids[d][rank],)
        out.append((paths[(d, pos)], score, index[(d - 1, parent_place)] if d else -1))
    return out


def capped_best_first(logp: torch.Tensor, width: int, caps: Sequence[int] | None,
                      budget: int) -> list[tuple[tuple[int, ...], float, int]]:
    """JetSpec's loop as docs/methods.md ("accum-logp") describes it (budget without the root):
    repeatedly take the open node of highest score (ties: lower id); below depth D it gets its first
    min(cap_d, K, room) children. (token path, score, parent index in this list or -1) per draft node, in creation order."""
    ids, lp = ranked_table(logp)
    depth, width = len(ids), min(width, logp.shape[-1])
    paths, scores, parents, depths = [()], [0.0], [-1], [0]
    open_nodes = [0]
    while open_nodes and len(paths) <= budget:
        u = min(open_nodes, key=lambda i: (-scores[i], i))
        open_nodes.remove(u)
        d = depths[u]
        if d >= depth:
            continue
        cap = width if caps is None or d >= len(caps) else caps[d]
        for j in range(min(cap, width, budget + 1 - len(paths))):
            open_nodes.append(len(paths))
            paths.append(paths[u] + (ids[d][j],))
            scores.append(f32(scores[u] + lp[d][j]))
            parents.append(u)
            depths.append(d + 1)
    return [(paths[i], scores[i], parents[i] - 1) for i in range(1, len(paths))]


def all_prefix_scores(logp: torch.Tensor, width: int, depth: int) -> list[float]:
    """Scores of every prefix of ranks < width up to `depth`, descending."""
    _, lp = ranked_table(logp)
    scores = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(width), repeat=d):
            s = 0.0
            for i, r in enumerate(ranks):
                s = f32(s + lp[i][r])
            scores.append(s)
    return sorted(scores, reverse=True)


def eagle2(anchor: int, logp_of: Callable[[tuple[int, ...]], list[float]], budget: int, width: int,
           depth: int) -> list[tuple[tuple[int, ...], float]]:
    """EAGLE-2 as docs/methods.md ("eagle2") describes it, with the documented ties: (token path,
    score) per kept node, in candidate order (depth, beam place, rank)."""
    depth = min(depth, budget)
    candidates: list[tuple[tuple[int, ...], float]] = []
    beams = [((), 0.0)]
    for _ in range(depth):
        level = []
        for path, score in beams:
            row = logp_of(path)
            order = ranked_ids(row)[:width]
            level += [(path + (tok,), f32(score + min(f32(row[tok]), 0.0))) for tok in order]
        first = len(candidates)
        candidates += level
        best = sorted(range(len(level)), key=lambda i: (-level[i][1], i))[:width]
        beams = [level[i] for i in best]
        assert first + len(level) == len(candidates)
    keep = sorted(range(len(candidates)), key=lambda i: (-candidates[i][1], i))[:budget]
    return [candidates[i] for i in sorted(keep)]


def node_paths(tree: DraftTree) -> list[tuple[int, ...]]:
    """Token path (anchor excluded) of every node."""
    tokens, parents, _ = tree.host
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, tree.num_nodes):
        paths.append(paths[parents[i]] + (tokens[i],))
    return paths


def check_invariants(tree: DraftTree, max_depth: int) -> None:
    """Parents precede children, depth = parent depth + 1, no duplicate (parent, token), depth within
    max_depth, ancestor mask = networkx reachability."""
    tokens, parents, depth = tree.host
    assert parents[0] == -1 and depth[0] == 0
    pairs = set()
    for i in range(1, tree.num_nodes):
        assert 0 <= parents[i] < i, f"node {i}: parent {parents[i]} does not precede it"
        assert depth[i] == depth[parents[i]] + 1
        assert (parents[i], tokens[i]) not in pairs, f"duplicate token {tokens[i]} under {parents[i]}"
        pairs.add((parents[i], tokens[i]))
    assert max(depth) <= max_depth
    graph = tree.to_networkx()
    mask = tree.ancestor_mask.cpu()
    for i in range(tree.num_nodes):
        expected = nx.ancestors(graph, i) | {i}
        assert set(mask[i].nonzero().flatten().tolist()) == expected, f"ancestor mask row {i}"


@st.composite
def depth_scores(draw: st.DrawFn, max_depth: int = 4, max_vocab: int = 6, min_depth: int = 0) -> DepthScores:
    """Per-depth log-probs of small random tables: smooth, with many exact ties, or with -inf entries."""
    depth = draw(st.integers(min_depth, max_depth))
    vocab = draw(st.integers(1, max_vocab))
    style = draw(st.sampled_from(["smooth", "ties", "neg-inf"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if style == "smooth":
        logits = torch.randn(depth, vocab, generator=g) * 2
    else:
        logits = torch.randint(0, 3, (depth, vocab), generator=g).float()  # equal logits: equal log-probs
    if style == "neg-inf":
        drop = torch.rand(depth, vocab, generator=g) < 0.4
        drop[:, 0] = False  # keep each row normalisable
        logits[drop] = float("-inf")
    return DepthScores(anchor=draw(st.integers(0, 1000)), logp=torch.log_softmax(logits, dim=-1))
