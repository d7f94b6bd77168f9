"""`self`: the target's own first k layers + final norm + LM head as a training-free draft model
(a layer-skip self-draft), with its own KV cache, drafting autoregressively: a chain (`chain`), or a
tree grown depth by depth under a growing policy (`eagle2`, `static`)."""

from __future__ import annotations

import torch

from specbench.drafters import DRAFTERS
from specbench.drafters.base import Drafter, DraftState, TeacherForced
from specbench.models.decoder import ForwardOutput, KVCache
from specbench.models.graphs import GraphedForward
from specbench.models.target import TargetModel
from specbench.trees.base import DraftTree, TreePolicy
from specbench.trees.grow import frontier_subtree, grow_tree
from specbench.verify.base import VerifyResult
from specbench.verify.sampling import process_logits


@DRAFTERS.register("self")
class SelfDrafter(Drafter):
    """Drafting with the shallow model. Its cache holds the committed tokens; each round feeds whatever
    committed tokens it has not seen (the anchor, and the last accepted draft when the whole chain was
    accepted) in one pass. Under `chain` it then drafts one token per step, keeping each step's K/V
    (greedy by default; when the verifier reads draft probabilities, i.e. rejection sampling at T > 0,
    it samples from its processed law). Under a growing policy each depth's frontier runs with tree
    attention over its root paths, as scratch K/V past the committed prefix.

    Exact replay of a greedy chain (state.reference): the chain drafted along the reference is, token for
    token, the shallow model's teacher-forced argmax, up to and including the first token that differs
    from the reference (the walk never reads past it). So one teacher-forced pass over the reference
    (`reference_argmax`, once per reference) gives every round's chain, built only up to that token."""

    name = "self"
    policies = "growing"  # chain is drafted by a direct loop; other policies grow the tree
    taps = ()
    weights = None

    def __init__(self, target: TargetModel, layers: int | None = None) -> None:
        super().__init__(target)
        total = target.config.num_layers
        self.layers = layers if layers is not None else max(1, total // 2)
        if not 1 <= self.layers <= total:
            raise ValueError(f"self drafter: layers must be in [1, {total}], got {self.layers}")
        self.cache: KVCache | None = None
        self.fed = 0  # committed tokens the draft cache holds (a prefix of state.tokens)
        self.appended = 0  # draft tokens appended after them in the last round
        self.graphs: GraphedForward | None = None  # the shallow model's steps on CUDA (1 or 2 tokens)
        self.reference_argmax: tuple[TeacherForced, list[int]] | None = None  # exact replay: the last reference's

    def begin(self, state: DraftState, prefill: ForwardOutput, max_seq_len: int) -> None:
        if self.cache is None or self.cache.max_seq_len < max_seq_len:
            self.cache = self.target.new_cache(max_seq_len, num_layers=self.layers)
            if self.target.device.type == "cuda" and self.cuda_graphs:
                self.graphs = GraphedForward(self.target.model, self.cache, buckets=[1, 2], num_layers=self.layers)
        self.cache.reset()
        self.fed = 0
        self.appended = 0

    def _step(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Append tokens [k] (device) at positions start.. to the draft cache; logits [V] of the last one.
        On CUDA each step replays a graph captured once per k (the cache's lengths are read on the
        device), and the drafted tokens never leave the device."""
        assert self.cache is not None
        k = tokens.shape[0]
        pos = torch.arange(start, start + k, device=tokens.device)[None]
        if self.graphs is not None and k <= 2:
            causal = torch.ones(k, k, dtype=torch.bool, device=tokens.device).tril_()[None]
            logits = self.graphs(tokens[None], pos, causal).logits
        else:
            logits = self.target.forward(tokens[None], pos, self.cache, None, (), logits_rows="last",
                                         num_layers=self.layers, kv_len=start + k).logits
        self.cache.advance(k)
        return logits[0, -1]

    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        assert self.cache is not None, "begin() was not called"
        if policy.name != "chain":
            return self._grow(state, policy, budget)
        if state.reference is not None and not state.want_draft_probs:
            return self._reference_chain(state, state.reference, budget)
        dev = self.target.device
        pending = torch.tensor(state.tokens[self.fed:], dtype=torch.long, device=dev)
        logits = self._step(pending, self.fed)
        self.fed = len(state.tokens)
        drafted: list[torch.Tensor] = []
        rows: list[torch.Tensor] = []
        for step in range(budget):
            if state.want_draft_probs:
                q = process_logits(logits, state.sampling)
                tok = torch.full((1,), state.draft_rng.categorical(q), dtype=torch.long, device=dev)
                rows.append(q)
            else:
                tok = logits.argmax().view(1)
            drafted.append(tok)
            if step + 1 < budget:
                logits = self._step(tok, self.fed + step)
        self.appended = len(drafted) - 1
        probs = torch.stack(rows) if rows else None
        return DraftTree.chain(state.anchor, torch.cat(drafted), draft_probs=probs, device=dev)

    def _reference_chain(self, state: DraftState, reference: TeacherForced, budget: int) -> DraftTree:
        """The greedy chain at the anchor of a known sequence, cut after its first token off the sequence."""
        if self.reference_argmax is None or self.reference_argmax[0] is not reference:
            length = len(reference.tokens)
            ids = torch.tensor([reference.tokens], device=self.target.device)
            out = self.target.forward(ids, torch.arange(length, device=ids.device)[None],
                                      self.target.new_cache(length, num_layers=self.layers), None, (),
                                      num_layers=self.layers, kv_len=length)
            self.reference_argmax = (reference, out.logits[0].argmax(-1).tolist())  # [L]: next token after each
        predicted, seq = self.reference_argmax[1], reference.tokens
        chain: list[int] = []
        for pos in range(state.cache_len, min(state.cache_len + budget, len(seq))):
            chain.append(predicted[pos])
            if pos + 1 >= len(seq) or predicted[pos] != seq[pos + 1]:
                break
        self.appended = 0  # the draft cache is not used
        return DraftTree.chain(state.anchor, chain, device=self.target.device)

    def _grow(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        assert self.cache is not None
        base = len(state.tokens) - 1  # the anchor's position

        def expand(tree: DraftTree, frontier: torch.Tensor) -> torch.Tensor:
            if tree.num_nodes == 1:  # the root: feed the committed tokens the cache lacks (kept)
                pending = torch.tensor(state.tokens[self.fed:], dtype=torch.long, device=self.target.device)
                logits = self._step(pending, self.fed)
                self.fed = len(state.tokens)
                return torch.log_softmax(logits, -1, dtype=torch.float32)[None]  # [1, V]
            sub, rows = frontier_subtree(tree, frontier)  # the frontier's root paths; K/V are scratch
            out = self.target.forward(sub.tokens[1:][None], (base + sub.depth[1:])[None], self.cache,
                                      sub.ancestor_mask[1:, 1:][None], (), logits_rows=rows - 1,
                                      num_layers=self.layers, kv_len=self.fed + sub.num_nodes - 1)
            return torch.log_softmax(out.logits[0], -1, dtype=torch.float32)  # [F, V]

        self.appended = 0
        return grow_tree(policy, state.anchor, expand, budget, budget, self.target.device)

    def observe(self, tree: DraftTree, result: VerifyResult, target_out: ForwardOutput) -> None:
        # Accepted drafts were fed at the positions they now hold; keep those, drop the rest.
        assert self.cache is not None
        keep = min(result.accepted_drafts, self.appended)
        self.cache.truncate(self.fed + keep)
        self.fed += keep
