"""`ngram`: prompt-lookup drafting. Match the last n committed tokens earlier in the context and
propose what followed. Several matches make a trie; the tree policy selects from it by match count."""

from __future__ import annotations

import numpy as np
import torch

from specbench.drafters import DRAFTERS
from specbench.drafters.base import Drafter, DraftState
from specbench.models.target import TargetModel
from specbench.trees.base import DraftTree, TreePolicy


def find_continuations(tokens: np.ndarray, max_ngram: int, min_ngram: int, max_matches: int, length: int) -> list[np.ndarray]:
    """Continuations (most recent match first) of the longest n-gram suffix (n from max to min) that
    occurs earlier in `tokens`; [] if none."""
    total = tokens.shape[0]
    for n in range(min(max_ngram, total - 1), min_ngram - 1, -1):
        suffix = tokens[total - n:]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: total - 1], n)  # starts 0..total-1-n
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if starts.size == 0:
            continue
        out = []
        for s in starts[::-1][:max_matches]:
            cont = tokens[s + n: s + n + length]
            if cont.size:
                out.append(cont)
        if out:
            return out
    return []


@DRAFTERS.register("ngram")
class NgramDrafter(Drafter):
    """Prompt lookup. Trie node score = log(fraction of matches that pass through it), so `chain`
    takes the majority continuation (ties: the most recent match), `ddtree` keeps the best-supported
    `budget` nodes (its top-B rule on the trie) and `static` the trie nodes its template ranks name.
    The other policies' rules (beams, fan-out caps) need per-depth scores, which a trie has not."""

    name = "ngram"
    policies = ("chain", "ddtree", "ddtree-vec", "static")  # select() on a scored trie
    taps = ()
    weights = None

    def __init__(self, target: TargetModel, max_ngram: int = 3, min_ngram: int = 1, max_matches: int = 8) -> None:
        super().__init__(target)
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram, self.max_matches = max_ngram, min_ngram, max_matches

    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        conts = find_continuations(np.asarray(state.tokens, dtype=np.int64), self.max_ngram, self.min_ngram,
                                   self.max_matches, budget)
        if not conts:
            return DraftTree.root_only(state.anchor)
        return policy.select(match_trie(state.anchor, conts), budget)  # on the host: the engine moves it


def match_trie(anchor: int, conts: list[np.ndarray]) -> DraftTree:
    """The trie of the continuations (shared prefixes merged; nodes in `DraftTree.from_paths` order) on
    the host, each node scored log(fraction of the continuations through it), in array ops over
    [M, M, L] (M matches of up to L tokens; no Python loop per node: drafting sits on the GPU round's
    critical path)."""
    m, length = len(conts), max(c.size for c in conts)
    table = np.full((m, length), -1, dtype=np.int64)
    valid = np.zeros((m, length), dtype=bool)
    for i, c in enumerate(conts):
        table[i, : c.size], valid[i, : c.size] = c, True
    both = valid[:, None, :] & valid[None, :, :]
    same = np.logical_and.accumulate((table[:, None, :] == table[None, :, :]) & both, axis=2)  # [M, M, L]: prefixes equal
    earlier = np.tril(np.ones((m, m), dtype=bool), -1)[:, :, None]
    is_node = valid & ~(same & earlier).any(axis=1)  # [M, L]: the first continuation with this prefix owns it
    node_id = np.zeros((m, length), dtype=np.int64)
    node_id[is_node] = np.arange(1, int(is_node.sum()) + 1)  # row-major: path by path, depth by depth
    owner = node_id[same.argmax(axis=1), np.arange(length)]  # [M, L]: node of each continuation's prefix
    parent = np.concatenate([np.zeros((m, 1), dtype=np.int64), owner[:, :-1]], axis=1)
    counts = same.sum(axis=1)  # [M, L]: continuations through the prefix
    depth = np.broadcast_to(np.arange(1, length + 1), (m, length))
    scores = np.concatenate([[0.0], np.log(counts[is_node] / m)])
    return DraftTree(tokens=torch.from_numpy(np.concatenate([[anchor], table[is_node]])),
                     parents=torch.from_numpy(np.concatenate([[-1], parent[is_node]])),
                     depth=torch.from_numpy(np.concatenate([[0], depth[is_node]])),
                     scores=torch.from_numpy(scores))
