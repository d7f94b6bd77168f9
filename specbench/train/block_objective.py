"""Anchor-block training of the DFlash-family heads (docs/methods.md, "Block objectives").

Per sequence, `anchors` random anchor positions a (a and a+1 both response tokens). Block a holds
[x_a, inputs at offsets 1..b-1] at positions a..a+b-1 and sees the target features of positions < a
(strictly before the anchor, as at inference). All blocks of a batch run in one head forward with a
block mask over [sequence features ; all blocks].

Inputs: a MASK block (prefix m = 0) or a clean prefix: offsets 1..m hold the true tokens x_{a+1..a+m},
the rest MASK; m = 0 with probability `p_mask_only`, else uniform over 1..b-1.
Labels: a MASK offset k predicts x_{a+k} (in place); with `clean_next` (jetspec-tree) a clean offset j
(the anchor included) predicts the next token x_{a+j+1}, which is what the path-conditioned pass reads.
A label counts only if it is a response token. Weights: exp(-(k-1)/gamma) with k the distance from
the last known token (k = offset - m for MASK offsets, 1 for clean next-token labels).
Teacher: the target's logits at the row before the label (row t predicts t+1).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from specbench.drafters.heads.backbone import DraftHead, HeadConfig, default_taps
from specbench.drafters.heads.masks import uniform_blocks_mask
from specbench.models.target import TargetModel
from specbench.train import OBJECTIVES
from specbench.train.losses import LOSSES, combined_loss, position_decay
from specbench.train.objective import HeadObjective, Metrics, TargetBatch


class BlockObjective(HeadObjective):
    """config: num_layers, num_taps | taps, block_size, anchors (per sequence), p_mask_only, losses
    ({"ce"|"fkl"|"rkl": weight}), gamma (None = no decay), temperature (KL), init_seed, lr."""

    attention: ClassVar[str] = ""
    clean_next: ClassVar[bool] = False
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, target: TargetModel, **config: Any) -> None:
        super().__init__(target)
        base = {"num_layers": 1, "num_taps": 3, "taps": None, "block_size": 16, "anchors": 32, "p_mask_only": 1.0,
                "losses": {"ce": 1.0}, "gamma": None, "temperature": 1.0, "init_seed": 0, "lr": None}
        base.update(self.defaults)
        unknown = set(config) - set(base)
        if unknown:
            raise ValueError(f"{self.name} objective: unknown setting(s) {sorted(unknown)}; known: {sorted(base)}")
        base.update(config)
        self.settings = base
        if not 0.0 <= float(base["p_mask_only"]) <= 1.0:
            raise ValueError(f"p_mask_only must be in [0, 1], got {base['p_mask_only']}")
        if int(base["anchors"]) < 1:
            raise ValueError(f"anchors (blocks per sequence) must be >= 1, got {base['anchors']}")
        bad_losses = set(dict(base["losses"])) - set(LOSSES)
        if bad_losses or not any(float(w) > 0 for w in dict(base["losses"]).values()):
            raise ValueError(f"{self.name} objective: losses must give positive weight to some of {LOSSES}, got {base['losses']}")
        taps = tuple(base["taps"]) if base["taps"] else default_taps(target.config.num_layers, int(base["num_taps"]))
        self.head_cfg = HeadConfig(drafter=self.drafter, taps=taps, num_layers=int(base["num_layers"]),
                                   block_size=int(base["block_size"]), attention=self.attention,
                                   clean_next=self.clean_next)
        self.taps = taps
        self.lr = base["lr"]
        self.head = DraftHead(target.config, self.head_cfg).to(target.device, torch.float32)
        self.head.init_weights(target.model, seed=int(base["init_seed"]))
        self.lm_head_weight = target.model.lm_head.weight.detach().to(torch.float32)  # [V, d]

    def head_config(self) -> dict[str, Any]:
        train = {k: v for k, v in self.settings.items() if k not in ("taps", "num_layers", "block_size")}
        return HeadConfig(**{**self.head_cfg.to_dict(), "train": train}).to_dict()

    # ---- block construction ------------------------------------------------------------------------
    def sample_blocks(self, batch: TargetBatch, generator: torch.Generator) -> dict[str, Tensor]:
        """Anchors, clean-prefix lengths, block inputs, labels and weights (all [B, G(, b)])."""
        s = self.settings
        B, T = batch.tokens.shape
        dev = batch.device
        b, g = self.head_cfg.block_size, min(int(s["anchors"]), T - 1)
        host_valid, host_mask = batch.host_masks()
        cand = host_mask[:, :-1] & host_mask[:, 1:]  # [B, T-1]
        score = torch.rand(B, T - 1, generator=generator).masked_fill(~cand, -1.0)
        top, anchors = score.topk(g, dim=1)  # [B, G]
        keep = top >= 0
        anchors = anchors.masked_fill(~keep, 0)
        prefix = torch.randint(1, b, (B, g), generator=generator)
        mask_only = torch.rand(B, g, generator=generator) < float(s["p_mask_only"])
        m = prefix.masked_fill(mask_only, 0)
        valid_len = host_valid.sum(dim=1)  # [B]
        m = torch.minimum(m, (valid_len[:, None] - 1 - anchors).clamp(min=0))  # clean tokens must exist
        anchors, keep, m = anchors.to(dev), keep.to(dev), m.to(dev)

        offsets = torch.arange(b, device=dev)
        pos = anchors[..., None] + offsets  # [B, G, b]
        clean = offsets <= m[..., None]  # the anchor (offset 0) is always a concrete input
        tokens = batch.tokens.gather(1, pos.clamp(max=T - 1).view(B, -1)).view(B, g, b)
        label_pos = torch.where(clean, pos + 1, pos)
        has_label = ~clean if not self.clean_next else torch.ones_like(clean)
        in_range = label_pos < T
        label_pos = label_pos.clamp(max=T - 1)
        is_response = batch.loss_mask.gather(1, label_pos.view(B, -1)).view(B, g, b)
        has_label = has_label & in_range & is_response & keep[..., None]
        distance = torch.where(clean, torch.ones_like(pos), offsets - m[..., None])
        return {"anchors": anchors, "keep": keep, "pos": pos, "tokens": tokens, "is_mask": ~clean,
                "label_pos": label_pos, "has_label": has_label, "distance": distance}

    def loss(self, batch: TargetBatch, generator: torch.Generator) -> tuple[Tensor, Metrics]:
        s = self.settings
        blk = self.sample_blocks(batch, generator)
        B, T = batch.tokens.shape
        b = self.head_cfg.block_size
        model = self.target.model
        feats = torch.cat([batch.hidden[t] for t in self.taps], dim=-1)  # [B, T, m*d]
        ctx_pos = torch.arange(T, device=batch.device)[None].expand(B, T)
        ctx_kv = self.head.context_kv(feats, ctx_pos, model)
        x = self.head.embed_block(blk["tokens"].view(B, -1), blk["is_mask"].view(B, -1), model)
        mask = uniform_blocks_mask(blk["anchors"], b, self.attention, T)  # [B, G*b, T + G*b]
        hidden = self.head(x, blk["pos"].view(B, -1), ctx_kv, mask, model)  # [B, G*b, d]
        sel = blk["has_label"].view(B, -1)
        if not bool(sel.any()):
            zero = hidden.sum() * 0.0
            return zero, {"labels": 0.0}
        rows = sel.nonzero(as_tuple=True)
        label_pos = blk["label_pos"].view(B, -1)[rows]  # [M]
        labels = batch.tokens[rows[0], label_pos]
        teacher = batch.target_logits[rows[0], label_pos - 1]  # [M, V]
        student = self.head.logits(hidden[rows], self.lm_head_weight)  # [M, V]
        weights = position_decay(blk["distance"].view(B, -1)[rows], s["gamma"])
        loss, parts = combined_loss(student, teacher, labels, weights, dict(s["losses"]), float(s["temperature"]))
        metrics: Metrics = dict(parts)
        with torch.no_grad():
            hit = (student.argmax(-1) == labels).float()
            first = (blk["distance"].view(B, -1)[rows] == 1).float()
            metrics["acc"] = hit.mean()
            metrics["acc_next"] = (hit * first).sum() / first.sum()  # NaN where no label is the next token
            metrics["labels"] = float(labels.numel())
        return loss, metrics


@OBJECTIVES.register("dflash")
class DFlashObjective(BlockObjective):
    """Bidirectional MASK blocks, CE with the gamma = 7 decay (the SpecForge DFlash recipe)."""

    name = drafter = "dflash"
    attention = "bidirectional"
    defaults = {"losses": {"ce": 1.0}, "gamma": 7.0}


@OBJECTIVES.register("jetspec")
class JetSpecObjective(BlockObjective):
    """Block-causal MASK blocks, forward KL to the target, no decay (the JetSpec recipe)."""

    name = drafter = "jetspec"
    attention = "block-causal"
    defaults = {"losses": {"fkl": 1.0}, "gamma": None}


@OBJECTIVES.register("jetspec-tree")
class JetSpecTreeObjective(BlockObjective):
    """Block-causal, MASK blocks with probability 0.25 else a clean prefix, clean inputs also predict
    the next token (the path-conditioned pass), forward KL."""

    name = drafter = "jetspec-tree"
    attention = "block-causal"
    clean_next = True
    defaults = {"losses": {"fkl": 1.0}, "gamma": None, "p_mask_only": 0.25}
