"""`DraftTree`, the draft scores a parallel drafter hands to a policy, and the `TreePolicy` interface.

Conventions (docs/DESIGN.md): node 0 is the root = the anchor (last committed token, not yet run through
the target); parents precede children; depth(root) = 0; `budget` counts draft nodes, root excluded.
This module is pure: tensors in, tensors out; it never imports models or the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, ClassVar, Sequence

import torch
from torch import Tensor

from specbench.kernels.masks import ancestor_masks  # noqa: F401  (re-exported: the CPU path and the reference)
from specbench.registry import require_declared
from specbench.trees.ranking import ranked_topk, top_indices


class TreeError(ValueError):
    """A tree that breaks the DraftTree invariants."""


Anchor = int | Tensor  # a host token id, or a [1] / 0-d device tensor (the GPU round: no host read)


def anchor_tensor(anchor: Anchor, device: torch.device | str) -> Tensor:
    """The anchor as a [1] int64 tensor on `device` (a device tensor is used as is: no copy, no sync)."""
    if isinstance(anchor, Tensor):
        return anchor.reshape(1).to(device=device, dtype=torch.long)
    return torch.full((1,), int(anchor), dtype=torch.long, device=device)


def device_ancestor_masks(parents: Tensor, depth: int) -> Tensor:
    """`ancestor_masks`, as one Triton launch where the parents are on CUDA (the verify forward of a GPU round)
    instead of its ~15 tensor ops (trees of up to the kernel's 1,024 nodes)."""
    if parents.is_cuda:
        from specbench.kernels.ancestor_mask import MAX_NODES, ancestor_mask

        if parents.shape[-1] <= MAX_NODES:
            return ancestor_mask(parents)
    return ancestor_masks(parents, depth)


@dataclass(eq=False)
class DraftTree:
    """A draft tree of N nodes in flat arrays (node 0 = root/anchor).

    tokens      [N] int64   token of each node (tokens[0] = anchor)
    parents     [N] int64   parent index, -1 for the root; parents[i] < i
    depth       [N] int64   root 0, child = parent + 1
    draft_probs [N, V] f32  optional: the law node i's token was drawn from, given everything drawn
                            before it (earlier siblings included: siblings drawn without replacement
                            have the renormalised remainders as rows); siblings are in draw order;
                            None = deterministic choices (point masses); row 0 unused. See
                            specbench.verify.draft_sampling
    scores      [N] f32     optional: the policy's score of each node (e.g. cumulative draft log-prob)
    """

    tokens: Tensor
    parents: Tensor
    depth: Tensor
    draft_probs: Tensor | None = None
    scores: Tensor | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    depth_bound: int | None = None  # a static bound on max depth (lets ancestor_mask skip a host read)

    # ---- constructors -------------------------------------------------------------------------
    @classmethod
    def root_only(cls, anchor: Anchor, device: torch.device | str = "cpu") -> "DraftTree":
        z = torch.zeros(1, dtype=torch.long, device=device)
        return cls(tokens=anchor_tensor(anchor, device), parents=z - 1, depth=z, depth_bound=0)

    @classmethod
    def chain(
        cls,
        anchor: Anchor,
        tokens: Sequence[int] | Tensor,
        draft_probs: Tensor | None = None,
        device: torch.device | str | None = None,
    ) -> "DraftTree":
        """A single path anchor -> tokens[0] -> tokens[1] ... ; draft_probs [D, V] are the rows of the
        draft tokens (the root row is added)."""
        t = torch.as_tensor(tokens, dtype=torch.long)
        dev = device if device is not None else (t.device if isinstance(tokens, Tensor) else "cpu")
        t = t.to(dev)
        n = t.numel() + 1
        all_tokens = torch.cat([anchor_tensor(anchor, dev), t])
        parents = torch.arange(-1, n - 1, dtype=torch.long, device=dev)
        depth = torch.arange(n, dtype=torch.long, device=dev)
        probs = None
        if draft_probs is not None:
            probs = torch.cat([torch.zeros_like(draft_probs[:1]), draft_probs], dim=0)
        return cls(tokens=all_tokens, parents=parents, depth=depth, draft_probs=probs, depth_bound=n - 1)

    @classmethod
    def from_paths(
        cls,
        anchor: int,
        paths: Sequence[Sequence[int]],
        device: torch.device | str = "cpu",
    ) -> "DraftTree":
        """A trie of token paths below the anchor (shared prefixes are merged), in insertion order."""
        tokens, parents, depth = [anchor], [-1], [0]
        child: dict[tuple[int, int], int] = {}
        for path in paths:
            node = 0
            for tok in path:
                key = (node, int(tok))
                if key not in child:
                    child[key] = len(tokens)
                    tokens.append(int(tok))
                    parents.append(node)
                    depth.append(depth[node] + 1)
                node = child[key]
        as_t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        return cls(tokens=as_t(tokens), parents=as_t(parents), depth=as_t(depth))

    @classmethod
    def from_lists(
        cls,
        tokens: Sequence[int],
        parents: Sequence[int],
        depth: Sequence[int],
        scores: Sequence[float] | None = None,
        device: torch.device | str = "cpu",
    ) -> "DraftTree":
        """A tree from host lists (what heap builders produce), moved to `device` in one copy each. A token
        may be a one-element tensor (a device anchor handed to a host builder: read back here)."""
        tokens = [int(t) for t in tokens]
        ints = torch.tensor([tokens, list(parents), list(depth)], dtype=torch.long).to(device)
        tree = cls(tokens=ints[0], parents=ints[1], depth=ints[2])
        if scores is not None:
            tree.scores = torch.tensor(list(scores), dtype=torch.float32).to(device)
        return tree

    # ---- derived ------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return int(self.tokens.numel())

    @property
    def budget(self) -> int:
        """Draft nodes, root excluded."""
        return self.num_nodes - 1

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    @cached_property
    def host(self) -> tuple[list[int], list[int], list[int]]:
        """(tokens, parents, depth) as Python lists, read once (one device->host copy)."""
        packed = torch.stack([self.tokens, self.parents, self.depth]).cpu().tolist()
        return packed[0], packed[1], packed[2]

    @cached_property
    def children(self) -> list[list[int]]:
        """children[i] = child node ids of i, in node order."""
        _, parents, _ = self.host
        out: list[list[int]] = [[] for _ in parents]
        for i, p in enumerate(parents):
            if p >= 0:
                out[p].append(i)
        return out

    @cached_property
    def max_depth(self) -> int:
        return max(self.host[2])

    @cached_property
    def ancestor_mask(self) -> Tensor:
        """[N, N] bool: mask[i, j] = j is i or an ancestor of i (what node i may attend to). Parentless
        nodes other than the root (padding) see only themselves. No host read when `depth_bound` is set
        or the tree is off the CPU (then N - 1 bounds the depth)."""
        n = self.num_nodes
        if n == 1:
            return torch.eye(n, dtype=torch.bool, device=self.device)
        if self.depth_bound is not None:
            depth = self.depth_bound
        else:
            depth = self.max_depth if self.device.type == "cpu" else n - 1
        return device_ancestor_masks(self.parents, depth)

    def path_to(self, node: int) -> list[int]:
        """Node ids from the root to `node` (inclusive)."""
        _, parents, _ = self.host
        out = [node]
        while parents[out[-1]] >= 0:
            out.append(parents[out[-1]])
        return out[::-1]

    def validate(self, allow_duplicate_siblings: bool = False) -> "DraftTree":
        """Check the invariants; raise TreeError saying which one failed. Returns self.

        Duplicate sibling tokens are an error unless allowed: children drawn from q *with replacement*
        may repeat, and merging them after drawing is lossy (specbench.verify.draft_sampling)."""
        n = self.num_nodes
        if not (self.tokens.shape == self.parents.shape == self.depth.shape == (n,)):
            raise TreeError("tokens, parents and depth must all be 1-D of the same length")
        tokens, parents, depth = self.host
        if parents[0] != -1 or depth[0] != 0:
            raise TreeError("node 0 must be the root: parent -1, depth 0")
        seen: set[tuple[int, int]] = set()
        for i in range(1, n):
            p = parents[i]
            if not 0 <= p < i:
                raise TreeError(f"node {i} has parent {p}: parents must precede children")
            if depth[i] != depth[p] + 1:
                raise TreeError(f"node {i} has depth {depth[i]} but its parent has depth {depth[p]}")
            if not allow_duplicate_siblings and (p, tokens[i]) in seen:
                raise TreeError(f"node {i} duplicates token {tokens[i]} under parent {p} (trees drawn with "
                                f"replacement may: pass allow_duplicate_siblings=True)")
            seen.add((p, tokens[i]))
        if self.draft_probs is not None and self.draft_probs.shape[0] != n:
            raise TreeError(f"draft_probs has {self.draft_probs.shape[0]} rows for {n} nodes")
        return self

    def to_networkx(self) -> Any:
        """A networkx DiGraph with edges parent -> child; node attributes token, depth (and score)."""
        import networkx as nx

        tokens, parents, depth = self.host
        scores = self.scores.tolist() if self.scores is not None else None
        g = nx.DiGraph()
        for i in range(self.num_nodes):
            attrs: dict[str, Any] = {"token": tokens[i], "depth": depth[i]}
            if scores is not None:
                attrs["score"] = scores[i]
            g.add_node(i, **attrs)
            if parents[i] >= 0:
                g.add_edge(parents[i], i)
        return g

    def subtree(self, keep: Sequence[int] | Tensor, checked: bool = True) -> "DraftTree":
        """The tree restricted to the node ids `keep` (must contain the root and be closed under
        parents), re-indexed in increasing original order. checked=False: `keep` is already sorted,
        unique and closed (as `select_top_scores` builds it), and nothing reads the device."""
        keep_t = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        if checked:
            keep_t = keep_t.unique(sorted=True)
        # old id -> new id; one slot more (-1) that a parent -1 indexes (negative indices count from the end)
        new_index = torch.full((self.num_nodes + 1,), -1, dtype=torch.long, device=self.device)
        new_index[keep_t] = torch.arange(keep_t.numel(), device=self.device)
        parents = new_index[self.parents[keep_t]]
        if checked and (bool((parents[1:] < 0).any()) or int(keep_t[0]) != 0):
            raise TreeError("subtree(): the kept nodes must include the root and every kept node's parent")
        sub = DraftTree(
            tokens=self.tokens[keep_t],
            parents=parents,
            depth=self.depth[keep_t],
            draft_probs=None if self.draft_probs is None else self.draft_probs[keep_t],
            scores=None if self.scores is None else self.scores[keep_t],
            meta=dict(self.meta),
            depth_bound=self.depth_bound,
        )
        known = self.__dict__.get("ancestor_mask")  # computed already: restricting it is two gathers
        if known is not None:
            sub.__dict__["ancestor_mask"] = known.index_select(0, keep_t).index_select(1, keep_t)
        return sub


@dataclass(eq=False)
class DepthScores:
    """What a parallel drafter proposes: one draft distribution per depth below the anchor.

    logp [D, V]: log-probabilities (full-vocabulary normalised) of the token at depth d+1, for
    d = 0..D-1 (a factorised surrogate of the draft's joint law; tree policies read only this).
    anchor: a host id, or a device tensor (the GPU round; builders then never read it back).
    """

    anchor: Anchor
    logp: Tensor

    @property
    def depth(self) -> int:
        return int(self.logp.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.logp.shape[-1])

    def check(self) -> "DepthScores":
        """Raise TreeError unless logp is a floating [D, V] tensor with V >= 1. Returns self."""
        if self.logp.dim() != 2 or not self.logp.is_floating_point() or self.logp.shape[-1] < 1:
            raise TreeError(f"DepthScores.logp must be a float [depth, vocab >= 1] tensor, got "
                            f"{self.logp.dtype} of shape {tuple(self.logp.shape)}")
        return self

    def topk(self, k: int) -> tuple[Tensor, Tensor]:
        """(tokens [D, k], logp [D, k] float32) sorted by descending log-prob, ties: lower token id
        first (exact on every device, see `specbench.trees.ranking`)."""
        vals, idx = ranked_topk(self.check().logp, k)
        return idx, vals


@dataclass(eq=False)
class TreeBatch:
    """B trees of one node count N in [B, N] arrays (tokens, parents, depth int64; scores float32 or
    None), what `TreePolicy.build_batch` returns: a drafter that builds many trees per round (JetSpec++'s
    foresight) keeps them in static buffers."""

    tokens: Tensor
    parents: Tensor
    depth: Tensor
    scores: Tensor | None = None
    depth_bound: int | None = None
    ancestor_mask: Tensor | None = None  # [B, N, N] when the builder knows it (chain: every tree is a path)

    def masks(self) -> Tensor:
        """[B, N, N] each tree's `DraftTree.ancestor_mask`, in one batched pass when not known."""
        if self.ancestor_mask is not None:
            return self.ancestor_mask
        return device_ancestor_masks(self.parents, self.depth_bound if self.depth_bound is not None else self.tokens.shape[1] - 1)

    @classmethod
    def stack(cls, trees: Sequence[DraftTree]) -> "TreeBatch":
        if len({t.num_nodes for t in trees}) != 1:
            raise TreeError(f"a tree batch needs one node count, got {[t.num_nodes for t in trees]}")
        scores = torch.stack([t.scores for t in trees]) if all(t.scores is not None for t in trees) else None
        return cls(tokens=torch.stack([t.tokens for t in trees]), parents=torch.stack([t.parents for t in trees]),
                   depth=torch.stack([t.depth for t in trees]), scores=scores, depth_bound=trees[0].depth_bound)

    def tree(self, b: int) -> DraftTree:
        """Tree b as a DraftTree (views of the batch's rows)."""
        return DraftTree(tokens=self.tokens[b], parents=self.parents[b], depth=self.depth[b],
                         scores=None if self.scores is None else self.scores[b], depth_bound=self.depth_bound)


class TreePolicy(ABC):
    """Turns a drafter's scores into the tree the target verifies, under a budget.

    `build` serves parallel drafters (one set of per-depth scores). `grow` serves autoregressive
    drafters (an `expand` callback, depth by depth; `specbench.trees.grow`). `select` serves drafters
    that produce a scored candidate tree themselves (n-gram tries, re-selection by path-conditioned
    scores): it keeps the best `budget` nodes under the policy's rule.

    can_grow (declared by every policy, no default): True exactly when the policy overrides `grow`;
    drafters that declare `policies = "growing"` work with those policies only.
    examples: argument sets the registry-driven tests build the policy with (each must be valid).
    """

    name: ClassVar[str] = ""
    can_grow: ClassVar[bool]
    examples: ClassVar[tuple[dict[str, Any], ...]] = ({},)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        require_declared(cls, TreePolicy, {"can_grow": "`can_grow = True` (it overrides grow(), so autoregressive "
                                                       "drafters can use it) or `can_grow = False`"})
        if "can_grow" in cls.__dict__ and cls.can_grow != (cls.grow is not TreePolicy.grow):
            raise TypeError(f"{cls.__qualname__} declares can_grow = {cls.can_grow} but "
                            f"{'does not override' if cls.can_grow else 'overrides'} grow()")

    @abstractmethod
    def build(self, scores: DepthScores, budget: int) -> DraftTree: ...

    def build_batch(self, anchors: Tensor, logp: Tensor, budget: int) -> TreeBatch:
        """B trees at once: anchors [B] (device tokens), logp [B, D, V] -> tree b = build(DepthScores(
        anchors[b], logp[b])). Default: one `build` each (the reference); policies whose builds are
        tensor ops override it with one batched pass (fewer kernels on a launch-bound GPU round)."""
        return TreeBatch.stack([self.build(DepthScores(anchors[b: b + 1], logp[b]), budget)
                                for b in range(logp.shape[0])])

    def capturable(self, device: torch.device) -> bool:
        """True when `build` (and `grow`, `select` where defined) run on `device` in tensor ops of static
        shape that never read the device back, so the GPU round can capture them in a CUDA graph. A
        policy that needs the host (a heap, host tables) keeps the default, False."""
        return False

    def grow(self, anchor: int, expand: Callable[[DraftTree, Tensor], Tensor], budget: int, max_depth: int,
             device: torch.device | str = "cpu") -> DraftTree:
        """A tree grown depth by depth from `expand(tree, frontier) -> logp [F, V]` (see
        `specbench.trees.grow`); only policies with `can_grow` implement it."""
        from specbench.trees import TREE_POLICIES

        growing = [n for n in TREE_POLICIES.names() if TREE_POLICIES.get(n).can_grow]
        raise TreeError(f"tree policy {self.name!r} builds trees from per-depth scores only; an autoregressive "
                        f"drafter needs one that grows them: {', '.join(growing)}")

    def select(self, candidates: DraftTree, budget: int) -> DraftTree:
        """Default: the `budget` highest-scoring nodes (scores must not increase from parent to child,
        as cumulative log-probs do, so the kept set is closed under parents). Ties: lower node id."""
        return select_top_scores(candidates, budget)


def check_budget(budget: int) -> int:
    """The budget as an int; TreeError if it is negative (it counts draft nodes, root excluded)."""
    if isinstance(budget, bool) or int(budget) != budget or budget < 0:
        raise TreeError(f"budget counts draft nodes (root excluded) and must be an integer >= 0, got {budget!r}")
    return int(budget)


def select_top_scores(candidates: DraftTree, budget: int) -> DraftTree:
    check_budget(budget)
    if candidates.scores is None:
        raise TreeError("select() needs candidates.scores (e.g. cumulative draft log-probs)")
    n = candidates.num_nodes
    if n - 1 <= budget:
        return candidates
    if candidates.tokens.is_cuda and candidates.draft_probs is None:
        selected = select_top_scores_kernel(candidates, budget)
        if selected is not None:
            return selected
    return select_top_scores_ops(candidates, budget)


def select_top_scores_ops(candidates: DraftTree, budget: int) -> DraftTree:
    """`select_top_scores` of a tree of more than `budget` draft nodes in tensor ops (every device)."""
    assert candidates.scores is not None
    # Stable descending sort (`top_indices`): equal scores keep node order, so a parent precedes an equal child.
    order = top_indices(candidates.scores[1:], budget) + 1
    keep = torch.nn.functional.pad(order.to(candidates.device), (1, 0))  # the root (id 0) first
    return candidates.subtree(keep.sort().values, checked=False)  # closed under parents by the score order


def select_top_scores_kernel(candidates: DraftTree, budget: int) -> DraftTree | None:
    """`select_top_scores` (N - 1 > budget, no draft_probs) in one or two Triton launches (`specbench.kernels.
    select_top`: the same nodes in the same order) instead of a sort and the subtree's ~10 index ops; None for a
    tree past the kernel's `MAX_NODES`."""
    from specbench.kernels.select_top import MAX_NODES, select_top

    if candidates.num_nodes > MAX_NODES:
        return None
    assert candidates.scores is not None
    tokens, parents, depth, scores = select_top(candidates.tokens, candidates.parents, candidates.depth,
                                                candidates.scores, budget)
    return DraftTree(tokens=tokens, parents=parents, depth=depth, scores=scores, meta=dict(candidates.meta),
                     depth_bound=candidates.depth_bound)
