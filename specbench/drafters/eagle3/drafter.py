"""`eagle3`: the autoregressive feature-level draft head, drafting depth by depth (docs/methods.md, "eagle3").

Head entries. Entry j of the head pairs token x_{j+1} with the fused target feature g_j of position j
and sits at RoPE position j; its output predicts x_{j+2}. With committed tokens x_0..x_n (x_n = the
anchor, not yet run through the target) the target has features for positions 0..n-1, so entries
0..n-1 are fully determined by verified data: they form the head's own KV cache, each committed
position exactly once, fed with target features. Entry n-1 (the anchor's) predicts depth 1.

A draft node at depth k >= 1 with token t is the entry (t, the head's own output at its parent) at
position n-1+k; it attends to the committed entries and to its own ancestors among the draft entries
(tree attention over the draft cache: on CUDA the Triton kernel, which reads only the committed entries
and this round's rows; elsewhere SDPA under a dense mask). Draft entries live in cache slots after the
committed ones and are never committed: after verification the accepted positions are fed again next round with the
target's features (what the head was trained to see at verified positions).

Drafting grows the tree through the policy (`specbench.trees.grow`): the policy calls `expand(tree,
frontier)` once per depth and the drafter runs the frontier nodes in one head pass. `eagle2` (k beams
per depth, global top-B) costs its depth setting in passes per round, `chain` costs `budget` passes.
A greedy chain is drafted by a direct loop that keeps tokens on the device (no host read per depth;
the same tree as `chain.grow`); when the verifier reads draft probabilities the chain is sampled from
the processed draft law instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specbench.drafters import DRAFTERS
from specbench.drafters.base import Drafter, DraftState, Weights
from specbench.drafters.eagle3.head import Eagle3Head, eagle3_feature_layers
from specbench.kernels.masks import pack_tree_mask
from specbench.models.decoder import AttentionFn, AttentionMeta, ForwardOutput, KVCache, is_triton_backend, sdpa_attention
from specbench.models.target import TargetModel
from specbench.trees.base import DraftTree, TreePolicy
from specbench.trees.grow import grow_tree
from specbench.trees.ranking import ranked_topk
from specbench.verify.base import Acceptance, VerifyResult
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


ROW_CAPACITY = 1024  # draft entries per round (root included): buffers are allocated once, at begin


@DRAFTERS.register("eagle3")
class Eagle3Drafter(Drafter):
    """Built as `Eagle3Drafter(target, checkpoint=DIR)`; without `checkpoint` the shipped head
    specbench/heads/eagle3-<target>/ is loaded. `random_init=True` builds an untrained head instead
    (`draft_vocab`, `seed`); `head=` takes an Eagle3Head object (from code, e.g. a training run).

    Device-only after `begin` (capturable at T = 0): the committed entries are fed in `observe` from
    the verify result's tensors, draft entries live in buffers of ROW_CAPACITY rows allocated once."""

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
        # Per-round draft entries: row 0 = the root (anchor's entry, committed), rows 1.. = draft nodes
        # at cache slots len + row - 1. hidden_rows: each row's output; visible[r, c]: row r sees row c.
        self.rows = 0
        self.hidden_rows = torch.zeros(ROW_CAPACITY, cfg.hidden_size, dtype=target.dtype, device=target.device)
        self.visible = torch.zeros(ROW_CAPACITY, ROW_CAPACITY, dtype=torch.bool, device=target.device)
        # Static tables, so a head pass plans its rows and mask in few kernels: row ids, the identity (a
        # frontier's rows see only themselves among each other) and, for the Triton kernel, `visible`
        # packed (bit j = draft row j + 1: `pack_tree_mask` of visible[:, 1:]) with each row's own bit.
        eye = torch.eye(ROW_CAPACITY, dtype=torch.bool, device=target.device)
        self.row_ids = torch.arange(ROW_CAPACITY, device=target.device)
        self.slot_offsets = self.row_ids - 1  # row r at cache slot len + r - 1 (depth k at position len - 1 + k)
        self.past_path = torch.full((1,), -1, dtype=torch.long, device=target.device)  # a path entry past the count
        self.eye = eye
        self.own_bits = pack_tree_mask(eye[:, 1:])  # [R, W] int32; row 0 (the root): no draft bit
        self.visible_bits = torch.zeros_like(self.own_bits)
        self.node_rows = torch.zeros(ROW_CAPACITY, dtype=torch.long, device=target.device)  # tree node id -> row
        self.root_logp = torch.zeros(self.head.draft_vocab, dtype=torch.float32, device=target.device)  # [K]
        # This round's tables, made once by `feed_context`: the cache slot of each row [R] and the RoPE
        # cos, sin [1, D + 1, 1, hd] of each depth 0..D (depth k sits at the slot of row k), so a head pass
        # slices both instead of computing positions and angles.
        self.round_slots = self.slot_offsets
        self.round_rope: tuple[Tensor, Tensor] | None = None
        self.causal: dict[tuple[int, bool], tuple[Tensor, Tensor | None]] = {}  # (feed size m, Triton) -> mask, bits
        self.passes = 0  # head passes of the last drafted round, its context feed included

    @property
    def taps(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.head.feature_layers)))

    @property
    def fed(self) -> int:
        """Committed entries in the head cache (a host read)."""
        return self.cache.host_lengths[0] if self.cache is not None else 0

    def capturable(self, policy: TreePolicy) -> bool:
        return policy.capturable(self.target.device) and policy.can_grow

    # ---- request / round bookkeeping ---------------------------------------------------------
    def begin(self, state: DraftState, prefill: ForwardOutput, max_seq_len: int) -> None:
        slots = max_seq_len + 2 * ROW_CAPACITY
        if self.cache is None or self.cache.max_seq_len < slots:
            self.cache = self.target.new_cache(slots, num_layers=1)
        self.cache.reset()
        dev = self.target.device
        n = state.cache_len  # entries 0..n-1: (x_{j+1}, g_j), x_n = the anchor
        tokens = torch.tensor(state.tokens[1: n + 1], dtype=torch.long, device=dev)
        self.feed(tokens, self._features(prefill)[:n], torch.full((1,), n, dtype=torch.long, device=dev), prefill=True)

    def observe(self, tree: DraftTree, result: VerifyResult | Acceptance, target_out: ForwardOutput) -> None:
        """Feed the newly committed positions: entry j pairs the j-th accepted token after the root
        (the bonus last) with the target features at the j-th path node. The path is padded to the
        tree's depth + 1 rows (static); rows past the count are fed as scratch and dropped."""
        acc = result if isinstance(result, Acceptance) else Acceptance.from_result(result, tree.num_nodes, self.target.device)
        n = tree.num_nodes
        depth = tree.depth_bound if tree.depth_bound is not None else n - 1
        rows = min(n, depth + 1)
        path = acc.path[:rows].clamp(min=0)  # -1 past the count: the root's features (finite in exact replay too)
        # the node after each path node: path[1:], -1 after the last; a tree's tokens with the bonus
        # appended map -1 (past the accepted path) to the bonus
        nxt = acc.path[1: rows + 1] if rows < n else torch.cat([acc.path[1:], self.past_path])  # [rows]
        tokens = torch.cat([tree.tokens, acc.bonus])[nxt]  # [rows]
        self.feed(tokens, self._features(target_out)[path], acc.count)

    def _features(self, out: ForwardOutput) -> Tensor:
        """[N, F*d]: the tapped target layers of every position of `out`, in feature order."""
        return torch.cat([out.hidden[layer][0] for layer in self.head.feature_layers], dim=-1)

    def _embed(self, tokens: Tensor) -> Tensor:
        return self.target.model.embed(tokens)

    # ---- head passes ----------------------------------------------------------------------------
    def feed(self, tokens: Tensor, features: Tensor, count: Tensor, prefill: bool = False) -> None:
        """Run m committed entries (tokens [m], target features [m, F*d]) at positions len..len+m-1,
        causal among themselves, of which the first count [1] are real: their K/V join the head cache
        (len += count) and the output of entry count-1 predicts depth 1 of the next round. `prefill`: the
        prompt's feed (any m; its mask is not kept)."""
        assert self.cache is not None, "begin() was not called"
        m = tokens.shape[0]
        steps = torch.arange(m, device=tokens.device) if prefill or m > ROW_CAPACITY else self.row_ids[:m]
        positions = (self.cache.lengths + steps)[None]  # [1, m]; slot = position
        causal, bits = self._causal(m, keep=not prefill)
        meta = AttentionMeta(lengths=self.cache.lengths, tree_mask=causal, kv_len=self.cache.max_seq_len,
                             tree_bits=bits)
        attend = self.target.model.attend if self._triton else sdpa_attention  # the target's tree attention
        h = self.head(self._embed(tokens)[None], self.head.fuse(features)[None], positions,
                      self.cache.k[0], self.cache.v[0], positions, meta, attend, self.target.model.ops)  # [1, m, d]
        last = torch.index_select(h[0], 0, count - 1, out=self.hidden_rows[0:1])  # [1, d]
        torch.log_softmax(self.head.logits(last, self.target.model.ops), -1, dtype=torch.float32, out=self.root_logp[None])
        self.cache.advance_device(count)

    def _causal(self, m: int, keep: bool = True) -> tuple[Tensor, Tensor | None]:
        """The causal mask of m fed entries [1, m, m] and, for the Triton kernel, its packed bits [1, m, W]:
        made on the first feed of each size (an eager round) and kept (`keep`), then read (a round's feed
        has one size: the tree's depth bound + 1)."""
        key = (m, self._triton)
        if key in self.causal:
            return self.causal[key]
        causal = torch.ones(m, m, dtype=torch.bool, device=self.target.device).tril_()[None]
        made = (causal, pack_tree_mask(causal) if self._triton else None)
        if keep:
            self.causal[key] = made
        return made

    def feed_context(self, state: DraftState, max_depth: int = ROW_CAPACITY - 1) -> Tensor:
        """Start a round of draft nodes up to `max_depth`: the root's child log-probs over the draft
        vocabulary [K] (the committed entries were fed by `begin` / `observe`); the round's slot and RoPE
        tables."""
        assert self.cache is not None, "begin() was not called"
        self.rows = 0
        self.passes = 1  # the feed that prepared this round
        self.round_slots = self.cache.lengths + self.slot_offsets  # [R]
        self.round_rope = self.head.rope(self.round_slots[: min(max_depth, ROW_CAPACITY - 1) + 1][None])
        return self.root_logp

    def run_nodes(self, tokens: Tensor, parent_rows: Tensor, depth: int) -> tuple[Tensor, Tensor]:
        """One head pass over a frontier of F new draft nodes of this round, all at depth `depth` >= 1.

        tokens [F] target ids; parent_rows [F] rows of their parents (0 = the root).
        Each node attends to the committed entries, its ancestors' entries and itself.
        Returns (rows [F] assigned to the nodes, child log-probs over the draft vocabulary [F, K])."""
        assert self.cache is not None and self.round_rope is not None, "begin() / feed_context() was not called"
        f = int(tokens.numel())
        first = self.rows + 1
        if first + f > ROW_CAPACITY:
            raise RuntimeError(f"eagle3: a round of more than {ROW_CAPACITY} draft entries; lower the budget or tree width")
        new = slice(first, first + f)
        rows = self.row_ids[new]  # [F]: a view of the static table
        ops = self.target.model.ops
        if self._triton:  # the packed mask only: the parents' ancestors and itself
            inputs_of = functools.partial(node_inputs_ops, norm=ops.norm)
            if tokens.is_cuda:  # one launch for the seven ops
                from specbench.kernels.node_inputs import node_inputs as inputs_of
            head = self.head
            x_in, hidden = inputs_of(tokens, parent_rows, self.target.model.embed.weight, self.hidden_rows,
                                     head.embed_norm.weight, head.hidden_norm.weight, head.embed_norm.eps,
                                     self.visible_bits, self.own_bits, first)  # [F, 2d], [F, d]; bits[new] written
            meta, attend = self._bits_attention(self.visible_bits[new], f, first + f - 1)
        else:
            vis = torch.bitwise_or(self.visible[parent_rows], self.eye[new], out=self.visible[new])  # [F, R]
            meta, attend = self._rows_attention(vis, rows, first + f - 1)
            hidden = self.hidden_rows[parent_rows].to(self.head.fc.weight.dtype)
            x_in = self.head.node_input(self._embed(tokens), hidden, ops)
        cos, sin = (t[:, depth: depth + 1].expand(1, f, *t.shape[2:]) for t in self.round_rope)  # [1, F, 1, hd] views
        x, delta = self.head.step_normed(x_in[None], hidden[None], (cos, sin), self.cache.k[0], self.cache.v[0],
                                         self.round_slots[new][None], meta, attend, ops)
        logits, h = self.head.logits_and_hidden(x[0], delta[0], ops)  # [F, K], [F, d]
        self.hidden_rows[new] = h
        self.rows += f
        self.passes += 1
        return rows, F.log_softmax(logits, dim=-1, dtype=torch.float32)  # the fp32 cast inside the kernel: one launch a depth

    @property
    def _triton(self) -> bool:
        return is_triton_backend(self.target.model.attention)

    def _bits_attention(self, bits: Tensor, f: int, drafted: int) -> tuple[AttentionMeta, AttentionFn]:
        """What a head pass over the last f of the `drafted` draft rows attends to, for the Triton kernel:
        the committed entries (slots [0, len)) and the draft rows 1..drafted (slots len + r - 1) whose bits
        `bits` [F, W] sets (the kernel reads just those)."""
        from specbench.kernels.tree_attention import context_attention

        lengths, slots_total = self.cache.lengths, self.cache.max_seq_len  # type: ignore[union-attr]

        def attend(q: Tensor, k: Tensor, v: Tensor, meta: AttentionMeta, scale: float) -> Tensor:
            return context_attention(q, k, v, meta.lengths, k, v, bits[None], scale, new_after_context=True,
                                     num_new=drafted, context_hint=slots_total - drafted)

        return AttentionMeta(lengths=lengths, tree_mask=self.eye[:f, :f][None], kv_len=slots_total), attend

    def _rows_attention(self, vis: Tensor, rows: Tensor, drafted: int) -> tuple[AttentionMeta, AttentionFn]:
        """What a head pass over the frontier `rows` [F] attends to under SDPA: the committed entries
        (slots [0, len)) and the draft rows 1..drafted (slots len + r - 1) that `vis` [F, R] marks, as a
        dense mask over the whole cache [1, 1, F, S]."""
        lengths, slots_total = self.cache.lengths, self.cache.max_seq_len  # type: ignore[union-attr]
        f = rows.numel()
        rel = torch.arange(slots_total, device=vis.device) - lengths + 1  # slot -> draft row (slot len + r - 1)
        in_rows = (rel >= 1) & (rel < ROW_CAPACITY)
        dense = (rel < 1)[None, :] | (in_rows[None, :] & vis.gather(1, rel.clamp(0, ROW_CAPACITY - 1)[None].expand(f, -1)))
        return AttentionMeta(lengths=lengths, tree_mask=self.eye[:f, :f][None], kv_len=slots_total,
                             dense_mask=dense[None, None]), sdpa_attention  # [1, 1, F, S]

    def to_target_logp(self, logp: Tensor) -> Tensor:
        """Draft-vocabulary log-probs [..., K] -> target-vocabulary log-probs [..., V] (-inf outside)."""
        out = logp.new_full((*logp.shape[:-1], self.target.config.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.head.d2t, logp)

    # ---- drafting ----------------------------------------------------------------------------------
    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        root_logp = self.feed_context(state, budget)  # growing to max_depth = budget: no node deeper
        anchor = state.anchor_on(self.target.device)
        if policy.name == "chain":
            return self._draft_chain(state, anchor, root_logp, budget)
        return grow_tree(policy, anchor, _RankedExpand(self), budget, budget, self.target.device)

    def expand(self, tree: DraftTree, frontier: Tensor) -> Tensor:
        """The `grow` callback: full-vocabulary child log-probs [F, V] of the frontier nodes of `tree`
        (one depth). Their parents were frontier nodes of earlier calls, so their rows exist."""
        return self.to_target_logp(self.draft_logp(tree, frontier))

    def expand_ranked(self, tree: DraftTree, frontier: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """`ranked_topk` of `expand`'s rows (tokens [F, k], log-probs [F, k]) without building them: the
        top-k over the draft vocabulary, mapped to target ids. The same ranking: d2t is increasing (the
        lower draft id of a tie is the lower target id) and the ids outside it are -inf, after every finite
        draft log-prob (log_softmax of finite logits is finite), so they only matter when k > K."""
        logp = self.draft_logp(tree, frontier)  # [F, K]
        if k > logp.shape[-1]:
            logp = self.to_target_logp(logp)
            vals, idx = ranked_topk(logp, k)
            return idx, vals
        vals, tokens = ranked_topk(logp, k, id_map=self.head.d2t)  # target ids (on CUDA in the top-k's launch)
        return tokens, vals

    def draft_logp(self, tree: DraftTree, frontier: Tensor) -> Tensor:
        """Child log-probs over the draft vocabulary [F, K] of the frontier nodes of `tree` (one head pass;
        the root's come from the context feed). A grower expands each depth once, in order from the root
        (`specbench.trees.grow`), so the p-th pass of a round is at depth p."""
        if tree.num_nodes == 1:  # the root: computed with the context feed
            return self.root_logp[None]
        if tree.num_nodes > ROW_CAPACITY:
            raise RuntimeError(f"eagle3: a tree of more than {ROW_CAPACITY} candidates; lower the budget or tree width")
        # the frontier's parents' rows (node 0 -> row 0, the root) and tokens; the rows run_nodes gives the frontier
        rows_of = frontier_rows_ops
        if frontier.is_cuda:  # one launch for the four ops
            from specbench.kernels.frontier_rows import frontier_rows as rows_of
        parent_rows, tokens = rows_of(frontier, tree.parents, tree.tokens, self.node_rows, self.rows + 1)
        return self.run_nodes(tokens, parent_rows, self.passes)[1]

    def _draft_chain(self, state: DraftState, anchor: Tensor, logp: Tensor, budget: int) -> DraftTree:
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
            index = index.view(1)  # a [1] index: a 0-d tensor index would be read back to the host
            tokens.append(d2t[index])
            picked.append(logp[index])
            if depth < budget:
                parent, child_logp = self.run_nodes(tokens[-1], parent, depth)
                logp = child_logp[0]
        tree = DraftTree.chain(anchor, torch.cat(tokens), torch.stack(probs) if probs else None, device=dev)
        tree.scores = torch.cat([logp.new_zeros(1), torch.cumsum(torch.cat(picked), 0)])
        return tree


class _RankedExpand:
    """The drafter's `expand` for `grow_tree`, with the `ranked` top-k that `ranked_expand` uses."""

    def __init__(self, drafter: Eagle3Drafter) -> None:
        self.drafter = drafter

    def __call__(self, tree: DraftTree, frontier: Tensor) -> Tensor:
        return self.drafter.expand(tree, frontier)

    def ranked(self, tree: DraftTree, frontier: Tensor, k: int) -> tuple[Tensor, Tensor]:
        return self.drafter.expand_ranked(tree, frontier, k)


def frontier_rows_ops(frontier: Tensor, parents: Tensor, tokens: Tensor, node_rows: Tensor, first: int) -> tuple[Tensor, Tensor]:
    """The rows of the frontier nodes' parents, node_rows[parents[frontier]] [F], and their tokens [F]; records
    the rows the next head pass gives the frontier, node_rows[frontier] = first .. first + F - 1. Tensor ops on
    any device: the reference of `kernels.frontier_rows` (one launch on CUDA)."""
    parent_rows, out_tokens = node_rows[parents[frontier]], tokens[frontier]
    node_rows[frontier] = torch.arange(first, first + frontier.numel(), device=node_rows.device)
    return parent_rows, out_tokens


def node_inputs_ops(tokens: Tensor, parent_rows: Tensor, embed: Tensor, hidden_rows: Tensor, embed_norm: Tensor,
                    hidden_norm: Tensor, eps: float, bits: Tensor, own_bits: Tensor, first: int, *,
                    norm: Callable[..., tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """A head pass's inputs over F new nodes (tokens [F], their parents' rows [F]): x [F, 2d] (the token
    embeddings and the parents' hidden rows, each RMS-normed by `norm` (a `LayerOps.norm`), concatenated) and
    the parents' hidden rows [F, d]; writes the nodes' packed visibility bits[first + i] = bits[parent_rows[i]]
    | own_bits[first + i]. Tensor ops on any device: the reference of `kernels.node_inputs` (one launch on CUDA)."""
    new = slice(first, first + tokens.numel())
    torch.bitwise_or(bits[parent_rows], own_bits[new], out=bits[new])
    hidden = hidden_rows[parent_rows]
    normed = [norm(x, w, eps, None)[0] for x, w in ((F.embedding(tokens, embed), embed_norm), (hidden, hidden_norm))]
    return torch.cat(normed, dim=-1), hidden


def _shipped_head_dir(target: TargetModel) -> Path:
    from specbench.drafters.heads.checkpoint import HeadCheckpointError, default_head_dir, train_hint

    directory = default_head_dir("eagle3", target.name)
    if not (directory / "config.json").is_file():
        raise HeadCheckpointError(
            f"no eagle3 head is shipped for target {target.name!r} (looked in {str(directory)!r}). Train one with "
            f"{train_hint('eagle3', target)} and pass drafter_args checkpoint=DIR/heads/eagle3, or copy it to that "
            f"directory; for an untrained head (tests, timing) pass drafter_args random_init=true",
            keys=("drafter_args",))
    return directory
