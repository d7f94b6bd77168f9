"""Row-wise helpers shared by the reference and the vectorised verifiers (same ops, same bits)."""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.trees.base import DraftTree


def normalised(rows: Tensor) -> Tensor:
    """Rows [..., V] as float64 laws (a row's law is its weights over their sum)."""
    w = rows.to(torch.float64)
    return w / w.sum(dim=-1, keepdim=True)


def draft_rows(tree: DraftTree, vocab: int, use_draft_probs: bool = True) -> Tensor:
    """[N, V] float64: the law each node's token was drawn from (one-hot rows for point masses;
    row 0, the root, is one-hot too and never read)."""
    one_hot = torch.nn.functional.one_hot(tree.tokens, vocab).to(torch.float64)  # [N, V]
    if tree.draft_probs is None or not use_draft_probs:
        return one_hot
    if tree.draft_probs.shape != (tree.num_nodes, vocab):
        raise ValueError(f"tree.draft_probs has shape {tuple(tree.draft_probs.shape)}; expected "
                         f"({tree.num_nodes}, {vocab}): one draft law per node (row 0 unused)")
    rows = tree.draft_probs.to(device=one_hot.device, dtype=torch.float64)
    return normalised(torch.cat([one_hot[:1], rows[1:]]))


def residual(target: Tensor, draft: Tensor, token: Tensor) -> Tensor:
    """max(0, target - draft) [..., V] (unnormalised) after rejecting `token` [...] drawn from `draft`.

    Its mass is the rejection probability, so it is zero only when rejection was impossible; floating
    point can still reach that case, and then the point-mass rule (target without `token`) is used,
    or the target itself if nothing else is left.
    """
    res = (target - draft).clamp(min=0)
    without = target.scatter(-1, token.unsqueeze(-1), 0.0)
    res = torch.where(res.sum(-1, keepdim=True) > 0, res, without)
    return torch.where(res.sum(-1, keepdim=True) > 0, res, target)


def check_drawable(node: int, q_x: float) -> None:
    """A token cannot have been drawn from a law that gives it zero probability."""
    if not q_x > 0:
        raise ValueError(f"node {node}'s token has draft probability {q_x}: draft_probs rows must be the law the "
                         f"token was drawn from (use draft_probs=None for deterministic drafts)")
