"""`eagle3`: the autoregressive feature-level draft head, drafting depth by depth (docs/methods.md, "eagle3").

Head entries. Entry j of the head pairs token x_{j+1} with the fused target feature g_j of position j
and sits at RoPE position j; its output predicts x_{j+2}. With committed tokens x_0..x_n (x_n = the
anchor, not yet run through the target) the target has features for positions 0..n-1, so entries
0..n-1 are fully determined by verified data: they form the head's own KV cache, each committed
position exactly once, fed with target features. Entry n-1 (the anchor's) predicts depth 1.

A draft node at depth k >= 1 with token t is the entry (t, the head's own output at its parent) at
position n-1+k; it attends to the committed entries and to its own ancestors among the draft entries
(tree attention over the draft cache). Draft entries live in cache slots after the committed ones and
are never committed: after verification the accepted positions are fed again next round with the
target's features (what the head was trained to see at verified positions).

Drafting grows the tree through the policy (`specbench.trees.grow`): the policy calls `expand(tree,
frontier)` once per depth and the drafter runs the frontier nodes in one head pass. `eagle2` (k beams
per depth, global top-B) costs its depth setting in passes per round, `chain` costs `budget` passes.
A greedy chain is drafted by a direct loop that keeps tokens on the device (no host read per depth;
the same tree as `chain.grow`); when the verifier reads draft probabilities the chain is sampled from
the processed draft law instead.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specbench.drafters import DRAFTERS
from specbench.drafters.base import Drafter, DraftState, Weights
from specbench.drafters.eagle3.head import Eagle3Head, eagle3_feature_layers
from specbench.models.decoder import AttentionMeta, ForwardOutput, KVCache, sdpa_attention
from specbench.models.target import TargetModel
from specbench.trees.base import DraftTree, TreePolicy
from specbench.trees.grow import grow_tree
from specbench.verify.base import VerifyResult
from specbench.verify.sampling import process_logits


def load_eagle3_head(directory: str | Path, target: TargetModel) -> Eagle3Head:
    """A trained head from `directory` (written by `save_head`), fingerprint-checked against `target`."""
    from specbench.drafters.heads.checkpoint import load_head

    state, config = load_head(directory, target)
    if config.get("drafter", "eagle3") != "eagle3":
        raise ValueError(f"{str(directory)!r} holds a {config.get('drafter')!r} head, not an eagle3 head")
    head = Eagle3Head.from_config(target.config, config)
    head.load_state_dict(state)
    return head


def random_head(target: TargetModel, draft_vocab: int = 0, seed: int = 0) -> Eagle3Head:
    """An untrained head (tests, cost measurements): EAGLE-3 feature layers, the draft vocabulary =
    the first `draft_vocab` target ids (0 = the whole vocabulary)."""
    cfg = target.config
    head = Eagle3Head(cfg, eagle3_feature_layers(cfg.num_layers), draft_vocab or cfg.vocab_size)
    return head.to(target.device).init_weights(target.model, seed)


@DRAFTERS.register("eagle3")
class Eagle3Drafter(Drafter):
    """Built as `Eagle3Drafter(target, checkpoint=DIR)`; without `checkpoint` the shipped head
    specbench/heads/eagle3-<target>/ is loaded. `random_init=True` builds an untrained head instead
    (`draft_vocab`, `seed`); `head=` takes an Eagle3Head object (from code, e.g. a training run)."""

    name = "eagle3"
    policies = "growing"  # chain is drafted by a direct loop; other policies grow the tree
    weights = Weights(train="specbench train --drafter {drafter} --data DATA_DIR --out DIR")

    def __init__(self, target: TargetModel, checkpoint: str | None = None, *, random_init: bool = False,
                 draft_vocab: int = 0, seed: int = 0, head: Eagle3Head | None = None) -> None:
        super().__init__(target)
        if head is None:
            if random_init:
                head = random_head(target, draft_vocab, seed)
            else:
                head = load_eagle3_head(checkpoint or _shipped_head_dir(target), target)
        self.head = head.cast(target.device, target.dtype).eval().requires_grad_(False)
        cfg = target.config
        self.cache: KVCache | None = None
        self.fed = 0  # committed entries in the head cache (entries 0..fed-1)
        self.pending: list[Tensor] = []  # [m, F*d] tapped target features of committed positions not yet fed
        # Per-round draft entries: row 0 = the root (anchor's entry, committed), rows 1.. = draft nodes
        # at cache slots fed + row - 1. hidden_rows: each row's output; visible[r, c]: row r sees row c.
        self.rows = 0
        self.hidden_rows = torch.zeros(1, cfg.hidden_size, dtype=target.dtype, device=target.device)
        self.visible = torch.zeros(1, 1, dtype=torch.bool, device=target.device)
        self.node_rows = torch.zeros(1, dtype=torch.long, device=target.device)  # tree node id -> row (this round)
        self.root_logp: Tensor | None = None  # [K] the root's child log-probs (this round)
        self.passes = 0  # head passes in the last draft() call (for cost measurements)

    @property
    def taps(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.head.feature_layers)))

    # ---- request / round bookkeeping ---------------------------------------------------------
    def begin(self, state: DraftState, prefill: ForwardOutput, max_seq_len: int) -> None:
        if self.cache is None or self.cache.max_seq_len < max_seq_len:
            self.cache = self.target.new_cache(max_seq_len, num_layers=1)
        self.cache.reset()
        self.fed = 0
        self.pending = [self._features(prefill)]

    def observe(self, tree: DraftTree, result: VerifyResult, target_out: ForwardOutput) -> None:
        # The accepted nodes (root first) are the newly committed positions: queue their target features.
        path = torch.tensor(result.path, dtype=torch.long, device=self.target.device)
        self.pending.append(self._features(target_out)[path])

    def _features(self, out: ForwardOutput) -> Tensor:
        """[N, F*d]: the tapped target layers of every position of `out`, in feature order."""
        return torch.cat([out.hidden[layer][0] for layer in self.head.feature_layers], dim=-1)

    def _embed(self, tokens: Tensor) -> Tensor:
        return self.target.model.embed(tokens)

    # ---- head passes ----------------------------------------------------------------------------
    def feed_context(self, state: DraftState) -> Tensor:
        """Run the committed entries not yet in the head cache (fed..n-1, causal) and start a round.
        Returns the root's child log-probs over the draft vocabulary [K]."""
        assert self.cache is not None, "begin() was not called"
        n = state.cache_len
        features = torch.cat(self.pending) if len(self.pending) > 1 else self.pending[0]
        m = n - self.fed
        if features.shape[0] != m or m < 1:
            raise RuntimeError(f"eagle3 bookkeeping: {features.shape[0]} queued features for {m} new committed "
                               f"positions (fed {self.fed}, committed {n})")
        dev = self.target.device
        tokens = torch.tensor(state.tokens[self.fed + 1: n + 1], dtype=torch.long, device=dev)
        positions = torch.arange(self.fed, n, device=dev)[None]  # [1, m]; slot = position
        causal = torch.ones(m, m, dtype=torch.bool, device=dev).tril_()[None]
        meta = AttentionMeta(lengths=self.cache.lengths, tree_mask=causal, kv_len=n)
        h = self.head(self._embed(tokens)[None], self.head.fuse(features)[None], positions,
                      self.cache.k[0], self.cache.v[0], positions, meta, sdpa_attention)  # [1, m, d]
        self.cache.advance(m)
        self.fed = n
        self.pending = []
        self.rows = 0
        self.hidden_rows[0] = h[0, -1]
        self.passes = 1
        return self._logp(h[0, -1:])[0]

    def run_nodes(self, tokens: Tensor, parent_rows: Tensor, depth: Tensor) -> tuple[Tensor, Tensor]:
        """One head pass over a frontier of F new draft nodes of this round.

        tokens [F] target ids; parent_rows [F] rows of their parents (0 = the root); depth [F] >= 1.
        Each node attends to the committed entries, its ancestors' entries and itself.
        Returns (rows [F] assigned to the nodes, child log-probs over the draft vocabulary [F, K])."""
        assert self.cache is not None, "begin() was not called"
        f = int(tokens.numel())
        first = self.rows + 1
        self._reserve(first + f)
        dev = self.target.device
        rows = torch.arange(first, first + f, device=dev)
        vis = self.visible[parent_rows]  # [F, R]: the parents' ancestors (root row: none)
        vis[torch.arange(f, device=dev), rows] = True
        self.visible[rows] = vis
        committed = self.fed
        kv_len = committed + first + f - 1
        dense = torch.cat([torch.ones(f, committed, dtype=torch.bool, device=dev), vis[:, 1: first + f]], dim=1)
        meta = AttentionMeta(lengths=self.cache.lengths, tree_mask=vis[:, rows][None], kv_len=kv_len,
                             dense_mask=dense[None, None])  # [1, 1, F, kv_len]
        positions = (committed - 1 + depth)[None]
        slots = (committed - 1 + rows)[None]
        h = self.head(self._embed(tokens)[None], self.hidden_rows[parent_rows][None], positions,
                      self.cache.k[0], self.cache.v[0], slots, meta, sdpa_attention)[0]  # [F, d]
        self.hidden_rows[rows] = h
        self.rows += f
        self.passes += 1
        return rows, self._logp(h)

    def _logp(self, hidden: Tensor) -> Tensor:
        return F.log_softmax(self.head.logits(hidden).float(), dim=-1)

    def _reserve(self, rows: int) -> None:
        """Room for `rows` per-round rows (root included) and their cache slots; grows by doubling."""
        assert self.cache is not None
        need_slots = self.fed + rows - 1
        if need_slots > self.cache.max_seq_len:
            grown = self.target.new_cache(max(need_slots, 2 * self.cache.max_seq_len), num_layers=1)
            grown.k[..., : self.fed, :] = self.cache.k[..., : self.fed, :]
            grown.v[..., : self.fed, :] = self.cache.v[..., : self.fed, :]
            grown.advance(self.fed)
            self.cache = grown
        have = self.visible.shape[0]
        if rows > have:
            size = max(rows, 2 * have)
            visible = torch.zeros(size, size, dtype=torch.bool, device=self.visible.device)
            visible[:have, :have] = self.visible
            hidden = self.hidden_rows.new_zeros(size, self.hidden_rows.shape[1])
            hidden[:have] = self.hidden_rows
            self.visible, self.hidden_rows = visible, hidden

    def to_target_logp(self, logp: Tensor) -> Tensor:
        """Draft-vocabulary log-probs [..., K] -> target-vocabulary log-probs [..., V] (-inf outside)."""
        out = logp.new_full((*logp.shape[:-1], self.target.config.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.head.d2t, logp)

    # ---- drafting ----------------------------------------------------------------------------------
    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        self.root_logp = self.feed_context(state)
        if policy.name == "chain":
            return self._draft_chain(state, self.root_logp, budget)
        return grow_tree(policy, state.anchor, self.expand, budget, budget, self.target.device)

    def expand(self, tree: DraftTree, frontier: Tensor) -> Tensor:
        """The `grow` callback: full-vocabulary child log-probs [F, V] of the frontier nodes of `tree`
        (one depth). Their parents were frontier nodes of earlier calls, so their rows exist."""
        if tree.num_nodes == 1:  # the root: computed with the context feed
            assert self.root_logp is not None, "draft() feeds the context before growing"
            return self.to_target_logp(self.root_logp)[None]
        if self.node_rows.numel() < tree.num_nodes:
            grown = self.node_rows.new_zeros(2 * tree.num_nodes)
            grown[: self.node_rows.numel()] = self.node_rows
            self.node_rows = grown
        parent_rows = self.node_rows[tree.parents[frontier]]  # node 0 -> row 0 (the root)
        rows, logp = self.run_nodes(tree.tokens[frontier], parent_rows, tree.depth[frontier])
        self.node_rows[frontier] = rows
        return self.to_target_logp(logp)

    def _draft_chain(self, state: DraftState, logp: Tensor, budget: int) -> DraftTree:
        """One node per pass; tokens stay on the device (no host read) unless sampling."""
        d2t, dev = self.head.d2t, self.target.device
        tokens: list[Tensor] = []
        picked: list[Tensor] = []
        probs: list[Tensor] = []
        parent = torch.zeros(1, dtype=torch.long, device=dev)
        for depth in range(1, budget + 1):
            if state.want_draft_probs:
                q = process_logits(logp, state.sampling)  # [K]
                index = torch.tensor(state.draft_rng.categorical(q), device=dev)
                probs.append(q.new_zeros(self.target.config.vocab_size).index_copy_(0, d2t, q))
            else:
                index = logp.argmax()
            tokens.append(d2t[index])
            picked.append(logp[index])
            if depth < budget:
                depth_t = torch.full((1,), depth, dtype=torch.long, device=dev)
                parent, child_logp = self.run_nodes(d2t[index].view(1), parent, depth_t)
                logp = child_logp[0]
        tree = DraftTree.chain(state.anchor, torch.stack(tokens), torch.stack(probs) if probs else None, device=dev)
        tree.scores = torch.cat([logp.new_zeros(1), torch.cumsum(torch.stack(picked), 0)])
        return tree


def _shipped_head_dir(target: TargetModel) -> Path:
    from specbench.drafters.heads.checkpoint import default_head_dir

    directory = default_head_dir("eagle3", target.name)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"no eagle3 head is shipped for target {target.name!r} (looked in {str(directory)!r}). Train one with "
            f"the shared trainer (objective 'eagle3') and pass drafter_args checkpoint=DIR, or copy it to that "
            f"directory; for an untrained head (tests, timing) pass drafter_args random_init=true")
    return directory
