"""`dflash` and `jetspec`: one head pass per round with MASK inputs gives per-depth marginals; the tree
policy builds the tree from them (chain = plain DFlash; ddtree / accum-logp trees). The two differ only
in the attention inside the block: bidirectional (DFlash) vs block-causal (JetSpec)."""

from __future__ import annotations

import torch

from specbench.drafters import DRAFTERS
from torch import Tensor

from specbench.drafters.base import DraftState, Phase, TeacherForced
from specbench.drafters.heads.drafter import HeadDrafter
from specbench.drafters.heads.masks import uniform_blocks_mask
from specbench.trees.base import DepthScores, DraftTree, TreePolicy
from specbench.verify.sampling import process_logits

FILL_LOGP = -1.0e9  # a reference table's entries below its top-K (never read by top-B / top-width policies)
REFERENCE_TOP_K = 256  # entries per depth a reference table keeps at least (more when a policy may read more)


class ReferencePass1:
    """Pass 1 of a parallel head at every anchor of a known sequence (exact replay), computed as training
    computes it: block-masked passes over the sequence, `chunk` anchors at a time (each block sees the
    context strictly before its anchor), from the context K/V of the whole sequence at once. Keeps the
    top-K log-probs per depth; chunks are computed when a round first reaches them."""

    def __init__(self, drafter: ParallelHeadDrafter, reference: TeacherForced, prompt_len: int, top_k: int,
                 chunk: int = 32) -> None:
        self.drafter, self.reference, self.prompt_len, self.chunk = drafter, reference, prompt_len, chunk
        target = drafter.target
        self.ids = torch.tensor([reference.tokens], device=target.device)
        length = self.ids.shape[1]
        feats = torch.cat([reference.hidden[t] for t in drafter.taps], dim=-1)  # [1, L, m*d]
        self.ctx_kv = drafter.head.context_kv(feats, torch.arange(length, device=target.device)[None], target.model)
        self.top_k = min(top_k, target.config.vocab_size)
        self.table: dict[int, tuple[Tensor, Tensor]] = {}  # anchor position -> top-K (log-probs, ids) [D, K]

    def _fill(self, first: int) -> None:
        drafter, head, model = self.drafter, self.drafter.head, self.drafter.target.model
        b, length, dev = drafter.block_size, self.ids.shape[1], self.ids.device
        group = torch.arange(first, min(first + self.chunk, length), device=dev)  # [G]
        g = group.numel()
        offsets = torch.arange(b, device=dev)
        tokens = self.ids[0, group][:, None].expand(g, b).reshape(1, -1)
        is_mask = (offsets > 0)[None].expand(g, b).reshape(1, -1)
        pos = (group[:, None] + offsets).reshape(1, -1)
        mask = uniform_blocks_mask(group[None], b, drafter.attention, length)
        x = head.embed_block(tokens, is_mask, model)
        hidden = head(x, pos, self.ctx_kv, mask, model)[0].view(g, b, -1)[:, 1:]  # [G, D, d]
        logp = torch.log_softmax(head.logits(hidden, model.lm_head.weight).float(), dim=-1)
        vals, idx = logp.topk(self.top_k, dim=-1)  # [G, D, K]
        for a, v, i in zip(group.tolist(), vals, idx):
            self.table[a] = (v, i)

    def logp(self, n: int) -> Tensor:
        """[D, V]: the top-K log-probs of pass 1 at anchor position n, every other entry FILL_LOGP."""
        if n not in self.table:
            self._fill(n - (n - self.prompt_len) % self.chunk)
        vals, idx = self.table[n]
        dense = torch.full((vals.shape[0], self.drafter.target.config.vocab_size), FILL_LOGP, device=vals.device)
        return dense.scatter_(1, idx, vals)


class ParallelHeadDrafter(HeadDrafter):
    """Per-depth scores from one MASK pass -> `policy.build`.

    When the verifier reads draft probabilities (rejection sampling at T > 0) the drafter samples a
    chain instead, one token per depth from that depth's processed marginal (a valid proposal: each
    law is fixed before its draw); this needs the `chain` policy.
    """

    sampled_policies = ("chain",)
    reference_pass1: ReferencePass1 | None = None  # exact replay: pass 1 of the last reference

    def phases(self, state: DraftState, policy: TreePolicy, budget: int) -> list[Phase]:
        if state.want_draft_probs:
            return [("draft", lambda _: self.sample_chain(state, policy, self.block_logp(state)[:budget]))]
        anchor = state.anchor_on(self.target.device)
        return [("draft", lambda _: DepthScores(anchor, self.pass1(state, budget))),  # [D, V]
                ("tree", lambda scores: policy.build(scores, budget))]

    def pass1(self, state: DraftState, entries: int) -> Tensor:
        """Pass 1's per-depth log-probs [D, V]: the MASK block on the draft cache, or under exact replay
        (state.reference) the same from a `ReferencePass1` table, built once per reference (the trees and
        budgets replayed on it share it) keeping at least the `entries` a policy reads per depth."""
        if state.reference is None:
            return self.block_logp(state)
        table = self.reference_pass1
        if table is None or table.reference is not state.reference or table.top_k < min(entries, self.target.config.vocab_size):
            table = self.reference_pass1 = ReferencePass1(self, state.reference, state.prompt_len,
                                                          max(entries, REFERENCE_TOP_K))
        return table.logp(state.cache_len)

    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        out = None
        for _, step in self.phases(state, policy, budget):
            out = step(out)
        return out

    def capturable(self, policy: TreePolicy) -> bool:
        return policy.capturable(self.target.device)

    def path_logp(self, state: DraftState, tree: DraftTree) -> torch.Tensor:
        """[N, V] log q(next token | context, path to node i): a pass over the tree's own tokens with
        a tree-causal mask (meaningful for heads trained with clean_next)."""
        is_mask = torch.zeros(tree.num_nodes, dtype=torch.bool, device=tree.device)
        return self.run_block(state, tree.tokens, is_mask, tree.depth, tree.ancestor_mask)

    def sample_chain(self, state: DraftState, policy: TreePolicy, logp: torch.Tensor) -> DraftTree:
        self.check_policy(policy.name, sampled=True)
        probs = process_logits(logp, state.sampling)  # [D, V]
        tokens = [state.draft_rng.categorical(row) for row in probs]
        return DraftTree.chain(state.anchor, tokens, draft_probs=probs, device=self.target.device)


@DRAFTERS.register("dflash")
class DFlashDrafter(ParallelHeadDrafter):
    """DFlash: bidirectional block (every offset sees the whole block)."""

    name = "dflash"
    attention = "bidirectional"


@DRAFTERS.register("jetspec")
class JetSpecDrafter(ParallelHeadDrafter):
    """JetSpec: block-causal (offset j sees offsets <= j), one pass, as the released code."""

    name = "jetspec"
    attention = "block-causal"
