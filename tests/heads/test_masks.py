"""Masks of the draft head, checked at every layer: what each query's output at layer l actually
depends on must be exactly what its mask row allows (a wrong mask on layers >= 1 is a known bug in
released DFlash-family code). Dependence is read from gradients: a masked key contributes an exact 0."""

from __future__ import annotations

import pytest
import torch

from specbench.drafters.heads.masks import block_pattern, grouped_mask, uniform_blocks_mask
from specbench.trees.base import DraftTree

from head_helpers import random_head


def dependency(head, target, feats, x, positions, ctx_pos, mask):
    """For each layer: [Q, C + Q] bool, True where query q's layer output depends on input row k
    (context feature row or block input row)."""
    feats = feats.clone().requires_grad_(True)
    x = x.clone().requires_grad_(True)
    ctx_kv = head.context_kv(feats, ctx_pos, target.model)
    _, layers = head(x, positions, ctx_kv, mask, target.model, return_layers=True)
    q = x.shape[1]
    out = []
    for layer_out in layers:
        dep = torch.zeros(q, feats.shape[1] + q, dtype=torch.bool)
        for i in range(q):
            g_f, g_x = torch.autograd.grad(layer_out[0, i].sum(), (feats, x), retain_graph=True)
            dep[i] = torch.cat([g_f[0].abs().sum(-1) > 0, g_x[0].abs().sum(-1) > 0])
        out.append(dep)
    return out


def closure(mask_inner: torch.Tensor) -> torch.Tensor:
    """Transitive closure of the within-block reachability (what several layers can propagate)."""
    reach = mask_inner.clone()
    for _ in range(reach.shape[0]):
        reach = reach | ((reach.float() @ reach.float()) > 0)
    return reach


@pytest.mark.parametrize("case", ["bidirectional", "block-causal", "tree", "training-blocks"])
def test_every_layer_sees_exactly_its_mask(tiny, case: str) -> None:
    torch.manual_seed(0)
    drafter = {"bidirectional": "dflash", "block-causal": "jetspec", "tree": "jetspec-tree", "training-blocks": "jetspec"}[case]
    head = random_head(tiny, drafter, num_layers=3)
    d = tiny.config.hidden_size
    ctx_len = 7
    feats = torch.randn(1, ctx_len, 2 * d)
    ctx_pos = torch.arange(ctx_len)[None]
    if case in ("bidirectional", "block-causal"):
        b = 5
        inner = block_pattern(b, case)
        mask = grouped_mask(torch.tensor([ctx_len]), [inner], ctx_len)[None]
        positions = ctx_len + torch.arange(b)[None]
    elif case == "tree":
        tree = DraftTree.from_paths(3, [[4, 5, 6], [4, 7], [8, 9]])
        inner = tree.ancestor_mask
        mask = grouped_mask(torch.tensor([ctx_len]), [inner], ctx_len)[None]
        positions = ctx_len + tree.depth[None]
    else:
        b = 4
        anchors = torch.tensor([[2, 5, 3]])
        mask = uniform_blocks_mask(anchors, b, "block-causal", ctx_len)
        positions = (anchors[..., None] + torch.arange(b)).view(1, -1)
    q = mask.shape[1]
    x = torch.randn(1, q, d)
    deps = dependency(head, tiny, feats, x, positions, ctx_pos, mask)
    allowed_inner = closure(mask[0, :, ctx_len:])
    for layer, dep in enumerate(deps):
        assert torch.equal(dep[:, :ctx_len], mask[0, :, :ctx_len]), f"layer {layer}: context visibility differs from the mask"
        assert torch.equal(dep[:, ctx_len:], allowed_inner), f"layer {layer}: block visibility differs from the mask"
    assert torch.equal(closure(mask[0, :, ctx_len:]), mask[0, :, ctx_len:]), "these patterns are transitively closed"


def test_uniform_blocks_mask_matches_definition() -> None:
    anchors = torch.tensor([[3, 0, 6], [1, 4, 2]])
    b, ctx_len = 3, 8
    for attention in ("bidirectional", "block-causal"):
        mask = uniform_blocks_mask(anchors, b, attention, ctx_len)
        assert mask.shape == (2, 9, ctx_len + 9)
        for r in range(2):
            for qi in range(9):
                g, off = divmod(qi, b)
                for k in range(ctx_len + 9):
                    if k < ctx_len:
                        want = k < int(anchors[r, g])
                    else:
                        g2, off2 = divmod(k - ctx_len, b)
                        want = g2 == g and (attention == "bidirectional" or off2 <= off)
                    assert bool(mask[r, qi, k]) == want


def test_grouped_mask_of_uneven_groups() -> None:
    a = block_pattern(2, "block-causal")
    t = DraftTree.from_paths(1, [[2], [3, 4]]).ancestor_mask
    mask = grouped_mask(torch.tensor([1, 3]), [a, t], 4)
    assert mask.shape == (6, 10)
    assert mask[:2, :4].sum(1).tolist() == [1, 1] and mask[2:, :4].sum(1).tolist() == [3, 3, 3, 3]
    assert torch.equal(mask[:2, 4:6], a) and torch.equal(mask[2:, 6:], t)
    assert not mask[:2, 6:].any() and not mask[2:, 4:6].any()


def test_unknown_attention_is_an_error() -> None:
    with pytest.raises(ValueError, match="block-causal"):
        block_pattern(3, "causal")
