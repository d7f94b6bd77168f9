"""`ngram`: prompt-lookup drafting. Match the last n committed tokens earlier in the context and
propose what followed. Several matches make a trie; the tree policy selects from it by match count."""

from __future__ import annotations

import math

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
    takes the majority continuation (ties: the most recent match) and top-B policies keep the
    best-supported branches."""

    name = "ngram"
    policies = "any"  # it calls select, which every policy has
    taps = ()
    weights = None

    def __init__(self, target: TargetModel, max_ngram: int = 3, min_ngram: int = 1, max_matches: int = 8) -> None:
        super().__init__(target)
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram, self.max_matches = max_ngram, min_ngram, max_matches

    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        device = self.target.device
        conts = find_continuations(np.asarray(state.tokens, dtype=np.int64), self.max_ngram, self.min_ngram,
                                   self.max_matches, budget)
        if not conts:
            return DraftTree.root_only(state.anchor, device)
        trie = DraftTree.from_paths(state.anchor, [c.tolist() for c in conts], device="cpu")
        # count matches through each node: walk every continuation's path in the trie
        counts = [0] * trie.num_nodes
        counts[0] = len(conts)
        child = {(p, t): i for i, (p, t) in enumerate(zip(trie.host[1], trie.host[0])) if p >= 0}
        for c in conts:
            node = 0
            for tok in c.tolist():
                node = child[(node, tok)]
                counts[node] += 1
        trie.scores = torch.tensor([math.log(k / len(conts)) for k in counts], dtype=torch.float64)
        chosen = policy.select(trie, budget)
        return DraftTree(tokens=chosen.tokens.to(device), parents=chosen.parents.to(device),
                         depth=chosen.depth.to(device), scores=chosen.scores)
