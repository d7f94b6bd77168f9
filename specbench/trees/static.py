"""`static`: a fixed tree template, given as paths of per-depth token ranks (Medusa / EAGLE-1 style).

A path (r_1, ..., r_d) is the node reached by taking the rank-r_1 token at depth 1, then the
rank-r_2 token at depth 2, ... (rank 0 = the most likely token; ties: lower token id). Every proper
prefix of a path must be listed too. The format is that of Medusa's `medusa_choices` and EAGLE-1's
tree lists, so such a list can be pasted into a YAML file:

    # my_tree.yaml            (or: paths: [[0], [1], [0, 0]])
    - [0]
    - [1]
    - [0, 0]

    tree: static   tree_args: {file: my_tree.yaml}  |  {paths: [[0], [1], [0, 0]]}  |  {tree: default-63}

Ranks mean: with a parallel drafter's per-depth scores (`build`), ranks in the depth's shared
distribution (Medusa); with an autoregressive drafter (`grow`), ranks in the node's own next-token
distribution (EAGLE-1); with a scored candidate tree (`select`, e.g. n-gram tries), ranks among a
node's children by score. Nodes deeper than the drafter's depth or with a rank >= V are dropped (with
their descendants); a template larger than the budget is cut to its `budget` best-scoring nodes.

Host policy: templates are walked on the host over tables read back from the device, so in the GPU
round a drafter under it drafts eagerly (its tree is then copied in; `capturable` is False).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from specbench.trees import TREE_POLICIES
from specbench.trees.base import DepthScores, DraftTree, TreeError, TreePolicy, check_budget, select_top_scores
from specbench.trees.grow import ExpandFn
from specbench.trees.ranking import f32_add, host_table, ranked_topk

# The top-31 / top-63 rank paths (depth <= 6) under a rank prior of acceptance probabilities
# [0.72, 0.10, 0.045, 0.028, 0.02, 0.015, 0.011, 0.009, 0.007, 0.006] at every depth, i.e. what `ddtree`
# returns on that table (tests/trees checks the derivation). A generic default, not a tuned tree.
NAMED_TREES: dict[str, list[tuple[int, ...]]] = {
    "default-31": [
        (0,), (1,), (2,), (3,), (4,), (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (2, 0), (3, 0), (0, 0, 0),
        (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 2, 0), (1, 0, 0), (2, 0, 0), (0, 0, 0, 0), (0, 0, 0, 1),
        (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 1, 0),
        (0, 0, 1, 0, 0), (0, 1, 0, 0, 0), (1, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0),
    ],
    "default-63": [
        (0,), (1,), (2,), (3,), (4,), (5,), (6,), (0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 0),
        (1, 1), (2, 0), (3, 0), (4, 0), (5, 0), (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3), (0, 0, 4),
        (0, 1, 0), (0, 2, 0), (0, 3, 0), (0, 4, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0), (4, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 3), (0, 0, 1, 0), (0, 0, 2, 0), (0, 0, 3, 0),
        (0, 1, 0, 0), (0, 2, 0, 0), (0, 3, 0, 0), (1, 0, 0, 0), (2, 0, 0, 0), (3, 0, 0, 0),
        (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 2), (0, 0, 0, 1, 0), (0, 0, 0, 2, 0),
        (0, 0, 1, 0, 0), (0, 0, 2, 0, 0), (0, 1, 0, 0, 0), (0, 2, 0, 0, 0), (1, 0, 0, 0, 0),
        (2, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 1), (0, 0, 0, 0, 1, 0), (0, 0, 0, 1, 0, 0),
        (0, 0, 1, 0, 0, 0), (0, 1, 0, 0, 0, 0), (1, 0, 0, 0, 0, 0),
    ],
}


def load_paths(file: str | Path) -> list[tuple[int, ...]]:
    """Rank paths from a YAML file: a list of paths, or a mapping with a `paths` list."""
    import yaml

    path = Path(file)
    if not path.is_file():
        raise TreeError(f"static tree file {str(path)!r} does not exist")
    data: Any = yaml.safe_load(path.read_text())
    if isinstance(data, dict):
        data = data.get("paths")
    if not isinstance(data, list):
        raise TreeError(f"{str(path)!r} must hold a list of rank paths (or 'paths: [...]'), e.g. [[0], [1], [0, 0]]")
    return data


def normalise_paths(paths: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Paths as int tuples sorted by (depth, ranks); TreeError on empty/negative/duplicate paths or a
    missing prefix."""
    out = []
    for p in paths:
        if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or not p:
            raise TreeError(f"a static tree path must be a non-empty list of ranks, got {p!r}")
        if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in p):
            raise TreeError(f"ranks must be integers >= 0, got path {list(p)}")
        out.append(tuple(int(r) for r in p))
    listed = set(out)
    if len(listed) != len(out):
        raise TreeError("a static tree lists a path twice")
    for p in out:
        if len(p) > 1 and p[:-1] not in listed:
            raise TreeError(f"path {list(p)} needs its prefix {list(p[:-1])} in the tree too")
    return sorted(out, key=lambda p: (len(p), p))


@TREE_POLICIES.register("static")
class StaticPolicy(TreePolicy):
    """A fixed template: exactly one of `paths` (Python list), `file` (YAML) or `tree` (a name in
    NAMED_TREES)."""

    name = "static"
    can_grow = True
    examples = ({"tree": "default-31"}, {"paths": [[0], [2], [0, 1], [0, 1, 0], [2, 0], [0, 0]]})

    def __init__(self, paths: Sequence[Sequence[int]] | None = None, file: str | None = None,
                 tree: str | None = None) -> None:
        given = [x is not None for x in (paths, file, tree)]
        if sum(given) != 1:
            raise TreeError(f"static needs exactly one of paths=[[0], [1], [0, 0], ...], file=PATH.yaml or "
                            f"tree=NAME (named trees: {', '.join(NAMED_TREES)})")
        if tree is not None:
            if tree not in NAMED_TREES:
                raise TreeError(f"unknown static tree {tree!r}; named trees: {', '.join(NAMED_TREES)}")
            paths = NAMED_TREES[tree]
        elif file is not None:
            paths = load_paths(file)
        self.paths = normalise_paths(paths)  # type: ignore[arg-type]
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        # template node i + 1 = paths[i]; node 0 = the root
        self.parent = [-1] + [index.get(p[:-1], 0) for p in self.paths]
        self.rank = [0] + [p[-1] for p in self.paths]
        self.depth = [0] + [len(p) for p in self.paths]

    def _kept(self, max_depth: int, vocab: int) -> list[int]:
        """Template nodes within the depth and vocabulary, closed under parents (root included)."""
        ok = [True] * len(self.parent)
        for i in range(1, len(ok)):
            ok[i] = ok[self.parent[i]] and self.depth[i] <= max_depth and self.rank[i] < vocab
        return [i for i in range(len(ok)) if ok[i]]

    def _tree(self, anchor: int, kept: list[int], tokens: dict[int, int], scores: dict[int, float],
              device: torch.device | str) -> DraftTree:
        """The template nodes `kept` (root first, parents before children) as a DraftTree."""
        new_id = {t: i for i, t in enumerate(kept)}
        return DraftTree.from_lists(
            [anchor] + [tokens[t] for t in kept[1:]], [-1] + [new_id[self.parent[t]] for t in kept[1:]],
            [self.depth[t] for t in kept], [0.0] + [scores[t] for t in kept[1:]], device)

    def build(self, scores: DepthScores, budget: int) -> DraftTree:
        budget = check_budget(budget)
        kept = self._kept(scores.check().depth, scores.vocab_size)
        if len(kept) == 1:
            return self._tree(scores.anchor, kept, {}, {}, scores.logp.device)
        depth = max(self.depth[t] for t in kept)
        tok, lp = host_table(*DepthScores(scores.anchor, scores.logp[:depth]).topk(
            1 + max(self.rank[t] for t in kept)))
        tokens, node_scores = {}, {0: 0.0}
        for t in kept[1:]:
            d, r = self.depth[t] - 1, self.rank[t]
            tokens[t] = tok[d][r]
            node_scores[t] = f32_add(node_scores[self.parent[t]], lp[d][r])
        return select_top_scores(self._tree(scores.anchor, kept, tokens, node_scores, scores.logp.device), budget)

    def grow(self, anchor: int, expand: ExpandFn, budget: int, max_depth: int,
             device: torch.device | str = "cpu") -> DraftTree:
        """Level by level: expand the template nodes that have children; each child takes its rank in
        its parent's own distribution."""
        budget = check_budget(budget)
        kept = self._kept(min(max_depth, budget), 2**62)
        tokens, node_scores = {}, {0: 0.0}
        grown = [0]  # template ids placed so far, in node order
        for d in range(max(self.depth[t] for t in kept)):
            children = [t for t in kept if self.depth[t] == d + 1 and self.parent[t] in node_scores]
            if not children:
                break
            parents = sorted({self.parent[t] for t in children})
            tree = self._tree(anchor, grown, tokens, node_scores, device)
            frontier = torch.tensor([grown.index(p) for p in parents], dtype=torch.long).to(device)
            logp = expand(tree, frontier)  # [F, V]
            vals, idx = ranked_topk(logp, 1 + max(self.rank[t] for t in children))
            tok, lp = host_table(idx, vals)
            row = {p: i for i, p in enumerate(parents)}
            for t in children:
                r = self.rank[t]
                if r < len(tok[row[self.parent[t]]]):  # rank < V
                    tokens[t] = tok[row[self.parent[t]]][r]
                    node_scores[t] = f32_add(node_scores[self.parent[t]], lp[row[self.parent[t]]][r])
                    grown.append(t)
        return select_top_scores(self._tree(anchor, grown, tokens, node_scores, device), budget)

    def select(self, candidates: DraftTree, budget: int) -> DraftTree:
        """Keep the candidates whose rank path (rank among siblings by score, ties lower id) is in the
        template, then the `budget` best of them."""
        if candidates.scores is None:
            raise TreeError("static.select() needs candidates.scores")
        scores = candidates.scores.tolist()
        listed = set(self.paths)
        path_of: dict[int, tuple[int, ...]] = {0: ()}
        keep = [0]
        for node in range(candidates.num_nodes):
            if node not in path_of:
                continue
            ranked = sorted(candidates.children[node], key=lambda c: (-scores[c], c))
            for r, child in enumerate(ranked):
                if path_of[node] + (r,) in listed:
                    path_of[child] = path_of[node] + (r,)
                    keep.append(child)
        return select_top_scores(candidates.subtree(sorted(keep)), budget)
