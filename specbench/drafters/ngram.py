"""`ngram`: prompt-lookup drafting. Match the last n committed tokens earlier in the context and
propose what followed. Several matches make a trie; the tree policy selects from it by match count.

One algorithm, in tensor ops of static shape (`lookup_trie`): the suffix match over every window of a
token history, the continuations, and their trie, padded to M * L nodes. On an accelerator the drafter
keeps the history in a device buffer that `observe` extends from the `Acceptance` (no host read), so the
GPU round captures its drafting in a CUDA graph; on the CPU (and under policies whose select needs the
host) the same function runs on the host's tokens and the trie is cut to its real nodes."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from specbench.drafters import DRAFTERS
from specbench.drafters.base import Drafter, DraftState, Phase
from specbench.models.decoder import ForwardOutput
from specbench.models.target import TargetModel
from specbench.trees.base import Anchor, DraftTree, TreePolicy, anchor_tensor
from specbench.verify.base import Acceptance, VerifyResult


def match_starts(history: Tensor, length: Tensor, max_ngram: int, min_ngram: int, max_matches: int) -> Tensor:
    """Continuation starts [max_matches] (most recent first; -1 = none) of the longest n-gram suffix
    (n from max_ngram down to min_ngram) of history[:length] that also ends earlier, before the last
    token. history [S] int64, length [1] (a device tensor: no host read); static shapes throughout."""
    size, device = history.shape[0], history.device
    ends = torch.arange(size, device=device)  # [S]: the last token of a window
    tail = (length - 1 - torch.arange(max_ngram, device=device)).clamp(min=0)  # [K]: the suffix, from its end
    padded = torch.cat([history.new_full((max_ngram,), -1), history])  # -1 matches no token
    shifted = torch.stack([padded[max_ngram - j: max_ngram - j + size] for j in range(max_ngram)])  # [K, S]: history[e - j]
    same = shifted == history.index_select(0, tail)[:, None]  # [K, S]
    match = same.long().cumprod(0).bool() & (ends < length - 1)[None, :]  # [K, S]: row n-1 = n-gram ends here
    n = torch.arange(1, max_ngram + 1, device=device)
    longest = torch.where(match.any(1) & (n >= min_ngram), n, 0).max()  # 0-d: 0 = no match
    row = match.index_select(0, (longest - 1).clamp(min=0).view(1))[0] & (longest > 0)  # [S]
    recent = torch.topk(torch.where(row, ends, -1), min(max_matches, size)).values  # [M] descending
    starts = torch.where(recent >= 0, recent + 1, -1)
    if starts.shape[0] < max_matches:
        starts = torch.cat([starts, starts.new_full((max_matches - starts.shape[0],), -1)])
    return starts


def continuations(history: Tensor, length: Tensor, starts: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """(tokens, valid) [M, size]: the up to `size` committed tokens after each start (-1: none)."""
    at = starts[:, None] + torch.arange(size, device=history.device)[None, :]  # [M, L]
    valid = (starts[:, None] >= 0) & (at < length)
    return torch.where(valid, history[at.clamp(0, history.shape[0] - 1)], 0), valid


def match_trie(anchor: Anchor, table: Tensor, valid: Tensor) -> tuple[DraftTree, Tensor]:
    """The trie of the continuations table [M, L] (valid [M, L]: each row's tokens a prefix of it, the
    matched rows first) with shared prefixes merged, and its real node count [1]. Nodes 1..K are the
    trie in `DraftTree.from_paths` order (row by row, depth by depth), each scored log(fraction of the
    continuations through it) in float64; nodes K+1..M*L are padding (parentless, depth 0, score -inf).
    Array ops over [L, M, M], no host read."""
    m, width = table.shape
    device = table.device
    tab, ok = table.T, valid.T  # [L, M]: depth-major, so the reductions over matches run along the last dim
    same = ((tab[:, :, None] == tab[:, None, :]) & ok[:, :, None] & ok[:, None, :]).long().cumprod(0).bool()
    # same [L, M, M]: continuations i and j agree up to this depth
    earlier = torch.ones(m, m, dtype=torch.bool, device=device).tril(-1)
    is_node = (valid & ~(same & earlier).any(-1).T)  # [M, L]: the first continuation with this prefix owns it
    flat = is_node.reshape(-1)
    real = flat.long().cumsum(0)  # row-major: path by path, depth by depth
    count = real[-1:] if flat.numel() else real.new_zeros(1)
    node_id = torch.where(flat, real, count + (~flat).long().cumsum(0)).view(m, width)  # a permutation of 1..M*L
    owner = node_id.gather(0, same.to(torch.uint8).argmax(-1).T)  # [M, L]: node of each continuation's prefix
    parent = torch.cat([owner.new_zeros(m, 1), owner[:, :-1]], dim=1)
    fraction = same.sum(-1).T.double() / valid[:, 0].sum().clamp(min=1).double()  # [M, L]
    depth = torch.arange(1, width + 1, device=device).expand(m, width)
    slots = (node_id.reshape(1, -1) - 1).expand(3, -1)
    ints = torch.stack([torch.where(is_node, table, 0), torch.where(is_node, parent, -1),
                        torch.where(is_node, depth, 0)]).reshape(3, -1)  # [3, M*L]
    root = anchor_tensor(anchor, device)
    root = torch.cat([root, root.new_full((1,), -1), root.new_zeros(1)])[:, None]  # [3, 1]: token, parent, depth
    ints = torch.cat([root, torch.empty_like(ints).scatter_(1, slots, ints)], 1)  # [3, 1 + M*L]
    scores = torch.where(is_node, fraction.log(), -torch.inf).reshape(-1)
    scores = torch.cat([fraction.new_zeros(1), torch.empty_like(scores).scatter_(0, slots[0], scores)])
    tree = DraftTree(tokens=ints[0], parents=ints[1], depth=ints[2], scores=scores, depth_bound=width,
                     meta={"padded": True})
    return tree, count


def lookup_trie(anchor: Anchor, history: Tensor, length: Tensor, max_ngram: int, min_ngram: int, max_matches: int,
                size: int, kernel: bool = False) -> tuple[DraftTree, Tensor]:
    """The padded trie (`match_trie`) of the continuations, up to `size` tokens each, of history[:length]'s
    longest matched suffix, and its real node count [1]. kernel: the same arrays from one Triton launch
    (`specbench.kernels.ngram_trie`, whose reference this function is)."""
    if kernel:
        from specbench.kernels.ngram_trie import ngram_trie

        tok, par, dep, scores, count = ngram_trie(history, length, anchor_tensor(anchor, history.device), max_ngram,
                                                  min_ngram, max_matches, size)
        return DraftTree(tokens=tok, parents=par, depth=dep, scores=scores, depth_bound=size,
                         meta={"padded": True}), count
    starts = match_starts(history, length, max_ngram, min_ngram, max_matches)
    return match_trie(anchor, *continuations(history, length, starts, size))


@DRAFTERS.register("ngram")
class NgramDrafter(Drafter):
    """Prompt lookup. Trie node score = log(fraction of matches that pass through it), so `chain`
    takes the majority continuation (ties: the most recent match), `ddtree` keeps the best-supported
    `budget` nodes (its top-B rule on the trie) and `static` the trie nodes its template ranks name.
    The other policies' rules (beams, fan-out caps) need per-depth scores, which a trie has not.

    Device drafting (`capturable`) under the policies whose select is tensor ops on the target's device
    (chain, ddtree-vec; ddtree off the CPU): the history lives in a device buffer and the trie keeps its
    padding, so the verified tree has 1 + budget nodes whatever the match. on_device: None = off the
    CPU only (on the CPU the host path verifies only the real nodes), True / False = always / never.
    kernel: device drafting as one Triton launch instead of ~86 tensor ops (None = on CUDA; True also on the
    CPU under TRITON_INTERPRET=1)."""

    name = "ngram"
    policies = ("chain", "ddtree", "ddtree-vec", "static")  # select() on a scored trie
    taps = ()
    weights = None

    def __init__(self, target: TargetModel, max_ngram: int = 3, min_ngram: int = 1, max_matches: int = 8,
                 on_device: bool | None = None, kernel: bool | None = None) -> None:
        super().__init__(target)
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if max_matches < 1:
            raise ValueError(f"need max_matches >= 1, got {max_matches}")
        self.max_ngram, self.min_ngram, self.max_matches = max_ngram, min_ngram, max_matches
        self.on_device = target.device.type != "cpu" if on_device is None else bool(on_device)
        self.kernel = target.device.type == "cuda" if kernel is None else bool(kernel)
        self.history: Tensor | None = None  # [S] committed tokens (device drafting)
        self.length: Tensor | None = None  # [1] how many of them
        self.tracking = False  # device drafting ran this request: observe extends the history

    def capturable(self, policy: TreePolicy) -> bool:
        return self.on_device and policy.capturable(self.target.device)

    def begin(self, state: DraftState, prefill: ForwardOutput, max_seq_len: int) -> None:
        device = self.target.device
        if self.history is None or self.history.shape[0] < max_seq_len + 1:
            self.history = torch.zeros(max_seq_len + 1, dtype=torch.long, device=device)  # + a scratch slot
            self.length = torch.zeros(1, dtype=torch.long, device=device)
        assert self.length is not None
        self.history[: len(state.tokens)].copy_(torch.from_numpy(np.asarray(state.tokens, dtype=np.int64)))
        self.length.fill_(len(state.tokens))
        self.tracking = False

    def draft(self, state: DraftState, policy: TreePolicy, budget: int) -> DraftTree:
        """The host path: the trie of state.tokens, cut to its real nodes, then `policy.select`."""
        if budget == 0:
            return DraftTree.root_only(state.anchor)
        tokens = torch.from_numpy(np.asarray(state.tokens, dtype=np.int64))  # a third of torch.tensor(list)'s time
        trie, count = lookup_trie(state.anchor, tokens, torch.full((1,), tokens.shape[0]), self.max_ngram,
                                  self.min_ngram, self.max_matches, budget)
        k = int(count)
        if k == 0:
            return DraftTree.root_only(state.anchor)
        return policy.select(DraftTree(tokens=trie.tokens[: k + 1], parents=trie.parents[: k + 1],
                                       depth=trie.depth[: k + 1], scores=trie.scores[: k + 1]), budget)

    def phases(self, state: DraftState, policy: TreePolicy, budget: int) -> list[Phase]:
        """Device drafting at T = 0; otherwise (the rounds a host verifier decides) the host path's tree,
        moved to the target's device, so host verifiers see the real nodes only."""
        if not self.capturable(policy) or not state.sampling.greedy:
            return [("draft", lambda _: self._moved(self.draft(state, policy, budget)))]
        assert self.history is not None and self.length is not None, "begin() was not called"
        self.tracking = True
        anchor = state.anchor_on(self.target.device)
        if budget == 0:
            return [("draft", lambda _: DraftTree.root_only(anchor, self.target.device))]
        history, length = self.history, self.length
        return [("draft", lambda _: lookup_trie(anchor, history, length, self.max_ngram, self.min_ngram,
                                                self.max_matches, budget, self.kernel)[0]),
                ("tree", lambda trie: policy.select(trie, budget))]

    def _moved(self, tree: DraftTree) -> DraftTree:
        device = self.target.device
        if tree.device == device:
            return tree
        return DraftTree(tokens=tree.tokens.to(device), parents=tree.parents.to(device), depth=tree.depth.to(device),
                         scores=None if tree.scores is None else tree.scores.to(device), depth_bound=tree.depth_bound)

    def observe(self, tree: DraftTree, result: VerifyResult | Acceptance, target_out: ForwardOutput) -> None:
        """Device drafting: append the round's committed tokens (the accepted drafts, then the bonus) to
        the history, writing every path row (the rows past the count land past the new length, or in
        the scratch slot) and advancing the device length. No host read."""
        if not self.tracking:
            return
        assert self.history is not None and self.length is not None
        acc = result if isinstance(result, Acceptance) else Acceptance.from_result(result, tree.num_nodes, tree.device)
        rows = torch.arange(acc.path.shape[0], device=tree.device)  # [N]
        drafted = tree.tokens[acc.path[1:].clamp(min=0)]  # [N - 1]
        committed = torch.where(rows == acc.count - 1, acc.bonus, torch.cat([drafted, acc.bonus]))  # [N]
        slots = (self.length + rows).clamp(max=self.history.shape[0] - 1)
        self.history.index_put_((slots,), committed)
        self.length.add_(acc.count)
