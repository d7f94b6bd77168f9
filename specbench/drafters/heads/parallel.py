"""`dflash` and `jetspec`: one head pass per round with MASK inputs gives per-depth marginals; the tree
policy builds the tree from them (chain = plain DFlash; ddtree / accum-logp trees). The two differ only
in the attention inside the block: bidirectional (DFlash) vs block-causal (JetSpec)."""

from __future__ import annotations

import torch

from specbench.drafters import DRAFTERS
from specbench.drafters.base import DraftState, Phase
from specbench.drafters.heads.drafter import HeadDrafter
from specbench.trees.base import DepthScores, DraftTree, TreePolicy
from specbench.verify.sampling import process_logits


class ParallelHeadDrafter(HeadDrafter):
    """Per-depth scores from one MASK pass -> `policy.build`.

    When the verifier reads draft probabilities (rejection sampling at T > 0) the drafter samples a
    chain instead, one token per depth from that depth's processed marginal (a valid proposal: each
    law is fixed before its draw); this needs the `chain` policy.
    """

    sampled_policies = ("chain",)

    def phases(self, state: DraftState, policy: TreePolicy, budget: int) -> list[Phase]:
        if state.want_draft_probs:
            return [("draft", lambda _: self.sample_chain(state, policy, self.block_logp(state)[:budget]))]
        anchor = state.anchor_on(self.target.device)
        return [("draft", lambda _: DepthScores(anchor, self.block_logp(state))),  # [D, V]
                ("tree", lambda scores: self.tree_from_scores(scores, policy, budget, state))]

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

    def tree_from_scores(self, scores: DepthScores, policy: TreePolicy, budget: int,
                         state: DraftState | None = None) -> DraftTree:
        """The tree for per-depth scores (the replay evaluator calls this too, without a state)."""
        return policy.build(scores, budget)

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
