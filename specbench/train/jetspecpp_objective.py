"""Training of the jetspec++ draft model and its state adapter (methods.md §5.1 items 2-4).

Per anchor a (as `BlockObjective`: a and a+1 response tokens, context = target states strictly
before a) two passes of the draft head and, per tapped layer, one of the adapter:

* J0 (MASK pass): [x_a, MASK x (b-1)]; offset k predicts x_{a+k} in place (the jetspec recipe).
* Refinement pass: a clean prefix of length m (Pr[m = 0] = p_mask_only = 0.25, else uniform over
  1..b-1: JetSpec++ Table 13) holds the true tokens x_{a+1..a+m}; the other offsets hold `fill`
  tokens as *token* inputs; each non-clean offset k predicts x_{a+k} in place. Clean offsets carry no
  label (they are given).
* Loss: forward KL to the target's law at the true prefix (JetSpec++ Table 14), for both passes.

What fills the non-clean positions (not stated by the paper, methods.md §5.1 item 3) is the `fill`
setting:
  self    (default) the head's own J0 top-1 tokens at those offsets, from the MASK pass of the same
          step (no gradient through the choice). At inference pass J1 reads exactly J0's top-1
          tokens, and a clean prefix of length m is the case "J0 got the first m right", so these
          are the inputs refinement meets, with the head's current mistakes rather than made-up
          ones; it costs no extra forward (the MASK pass is trained anyway).
  random  uniform random token ids (corruption that carries no information about the block).
  mask    the learned MASK embedding (clean prefix + MASK: the "mask inputs" row of Table 4).
Fully noised training (Table 4's other ablation) is p_mask_only = 1.

The adapter (per tap l): inputs the true block tokens x_a..x_{a+b-1} at positions a..a+b-1 and the
tap's true states h^l_{<a}; target h^l_{a+j}; loss sum_j w_j |h_hat - h|^2 / |h|^2 over valid
positions, w_j = (j+1)^-kappa (kappa = 1/2 by default; offset 0 is the anchor). Eq. 10 of the paper
is not published: the relative squared error and this weight are [INFERRED] (earlier offsets matter
more, since a later state is used only when every draft before it is accepted). Reported per tap:
err = mean |h_hat - h| / |h| and cos = mean cosine similarity.

Settings (besides BlockObjective's): fill, mask_weight (J0 loss), refine_weight, attention
(block-causal | bidirectional, the Table 15 ablation), adapter (train one; default true),
adapter_layers (int or one per tap), kappa, adapter_weight, init_from (a jetspec / jetspec++ head
directory of the same shape to start from, e.g. to fine-tune a trained JetSpec head for refinement).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from specbench.drafters.heads.masks import uniform_blocks_mask
from specbench.drafters.jetspecpp.adapter import AdapterConfig, StateAdapter, per_tap_layers
from specbench.drafters.jetspecpp.model import NAME, JetSpecPPModel, load_jetspecpp
from specbench.models.target import TargetModel
from specbench.train import OBJECTIVES
from specbench.train.block_objective import BlockObjective
from specbench.train.losses import combined_loss, position_decay
from specbench.train.objective import Metrics, TargetBatch

FILLS = ("self", "random", "mask")


def position_weights(block_size: int, kappa: float, device: torch.device | str = "cpu") -> Tensor:
    """w_j = (j + 1)^-kappa for block offsets j = 0..b-1 (kappa = 0: uniform)."""
    return (torch.arange(block_size, device=device, dtype=torch.float32) + 1.0) ** (-float(kappa))


def state_errors(pred: Tensor, true: Tensor) -> tuple[Tensor, Tensor]:
    """pred, true [..., d] -> (squared relative error |pred - true|^2 / |true|^2, cosine) [...], fp32."""
    p, t = pred.float(), true.float()
    rel2 = (p - t).pow(2).sum(-1) / t.pow(2).sum(-1).clamp_min(1e-12)
    return rel2, F.cosine_similarity(p, t, dim=-1)


@OBJECTIVES.register(NAME)
class JetSpecPPObjective(BlockObjective):
    """Draft head (J0 + refinement) and state adapter, trained together (one module, one optimizer)."""

    name = drafter = NAME
    attention: ClassVar[str] = "block-causal"
    defaults = {"losses": {"fkl": 1.0}, "gamma": None, "p_mask_only": 0.25, "fill": "self", "mask_weight": 1.0,
                "refine_weight": 1.0, "attention": "block-causal", "adapter": True, "adapter_layers": 1, "kappa": 0.5,
                "adapter_weight": 1.0, "init_from": None}

    def __init__(self, target: TargetModel, **config: Any) -> None:
        self.attention = str(config.get("attention", self.defaults["attention"]))  # read by BlockObjective
        super().__init__(target, **config)
        s = self.settings
        if s["fill"] not in FILLS:
            raise ValueError(f"{self.name} objective: fill must be one of {FILLS}, got {s['fill']!r}")
        for key in ("mask_weight", "refine_weight", "adapter_weight", "kappa"):
            if float(s[key]) < 0:
                raise ValueError(f"{self.name} objective: {key} must be >= 0, got {s[key]}")
        if not (float(s["mask_weight"]) > 0 or float(s["refine_weight"]) > 0 or (s["adapter"] and float(s["adapter_weight"]) > 0)):
            raise ValueError(f"{self.name} objective: nothing to train: give mask_weight, refine_weight or adapter_weight "
                             f"(with adapter=true) a positive weight")
        self.draft = self.head
        adapter = None
        if s["adapter"]:
            cfg = AdapterConfig(taps=self.taps, layers=per_tap_layers(s["adapter_layers"], self.taps),
                                block_size=self.head_cfg.block_size)
            adapter = StateAdapter(target.config, cfg).to(target.device, torch.float32)
            adapter.init_weights(target.model, seed=int(s["init_seed"]))
        self.adapter = adapter
        self.head = JetSpecPPModel(self.draft, adapter)
        if s["init_from"]:
            self.init_from(str(s["init_from"]))

    @torch.no_grad()
    def init_from(self, directory: str) -> None:
        """Start from a trained head (a jetspec or jetspec++ checkpoint of the same shape); its adapter
        too when it has one of this objective's shape. A resumed run loads its own state over this."""
        head, adapter = load_jetspecpp(self.target, directory)
        keys = ("taps", "num_layers", "block_size", "attention")
        diff = {k: getattr(head.config, k) for k in keys if getattr(head.config, k) != getattr(self.head_cfg, k)}
        if diff:
            raise ValueError(f"init_from {directory!r} holds a head with {diff}, unlike this objective's: set those "
                             f"settings to match (--head-arg jetspec++:KEY=VALUE)")
        self.draft.load_state_dict({k: v.float() for k, v in head.state_dict().items()})
        if adapter is not None and self.adapter is not None and adapter.config == self.adapter.config:
            self.adapter.load_state_dict({k: v.float() if v.is_floating_point() else v
                                          for k, v in adapter.state_dict().items()})

    def head_config(self) -> dict[str, Any]:
        cfg = super().head_config()
        cfg["adapter"] = self.adapter.config.to_dict() if self.adapter is not None else None
        return cfg

    # ---- the draft head ----------------------------------------------------------------------------
    def _pass_logits(self, tokens: Tensor, is_mask: Tensor, pos: Tensor, ctx_kv: list, mask: Tensor) -> Tensor:
        """One block pass over all blocks: tokens, is_mask [B, G, b] -> logits [B, G, b-1, V] of offsets 1.."""
        B, G, b = tokens.shape
        model = self.target.model
        x = self.draft.embed_block(tokens.view(B, -1), is_mask.reshape(B, -1), model)
        hidden = self.draft(x, pos, ctx_kv, mask, model).view(B, G, b, -1)[:, :, 1:]  # strided: offsets 1..
        # one [rows, d] x [d, V] product: on the strided 4-D slice F.linear runs a batched product of b - 1 rows
        # per block (one source of the fp32 bmm that took 28 % of the H200's training step, 2026-12-03,
        # docs/measurements/README.md)
        flat = hidden.reshape(B * G * (b - 1), hidden.shape[-1])
        return self.draft.logits(flat, self.lm_head_weight).view(B, G, b - 1, -1)

    def _kl(self, logits: Tensor, label_pos: Tensor, has_label: Tensor, distance: Tensor,
            batch: TargetBatch) -> tuple[Tensor, Metrics]:
        """The configured losses on the labelled rows: logits [B, G, b-1, V]; label_pos, has_label,
        distance [B, G, b-1]."""
        rows = has_label.nonzero(as_tuple=True)
        b_idx = rows[0]
        lp = label_pos[rows]
        student = logits[rows]  # [M, V]
        teacher = batch.target_logits[b_idx, lp - 1]
        labels = batch.tokens[b_idx, lp]
        weights = position_decay(distance[rows], self.settings["gamma"])
        loss, losses = combined_loss(student, teacher, labels, weights, dict(self.settings["losses"]),
                                     float(self.settings["temperature"]))
        parts: Metrics = dict(losses)
        parts["acc"] = (student.detach().argmax(-1) == labels).float().mean()
        return loss, parts

    def refine_inputs(self, tokens: Tensor, clean: Tensor, logits0: Tensor,
                      generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """The refinement pass's inputs: the true tokens [B, G, b] on the clean prefix `clean`
        [B, G, b], the `fill` elsewhere (logits0 [B, G, b-1, V]: the J0 pass). -> (tokens, is_mask)."""
        fill = self.settings["fill"]
        if fill == "self":
            filled = torch.cat([tokens[:, :, :1], logits0.detach().argmax(-1)], dim=2)
        elif fill == "random":
            filled = torch.randint(self.target.config.vocab_size, tokens.shape, generator=generator).to(tokens.device)
        else:
            filled = tokens
        is_mask = ~clean if fill == "mask" else torch.zeros_like(clean)
        return torch.where(clean, tokens, filled), is_mask

    def loss(self, batch: TargetBatch, generator: torch.Generator) -> tuple[Tensor, Metrics]:
        s = self.settings
        blk = self.sample_blocks(batch, generator)
        B, T = batch.tokens.shape
        b = self.head_cfg.block_size
        dev = batch.device
        model = self.target.model
        G = blk["anchors"].shape[1]
        keep = blk["keep"][..., None]
        offsets = torch.arange(b, device=dev)
        tokens = blk["tokens"]  # [B, G, b] the true tokens at every offset
        clean = ~blk["is_mask"]  # [B, G, b], offset 0 (the anchor) always clean
        pos1 = blk["pos"][:, :, 1:]
        label0 = pos1.clamp(max=T - 1)
        has0 = (pos1 < T) & batch.loss_mask.gather(1, label0.reshape(B, -1)).view(B, G, b - 1) & keep
        has1 = blk["has_label"][:, :, 1:]
        train0 = float(s["mask_weight"]) > 0 and bool(has0.any())
        train1 = float(s["refine_weight"]) > 0 and bool(has1.any())
        total = self.draft.norm.weight.sum() * 0.0  # a zero with a graph, whatever is trained below
        metrics: Metrics = {}
        if train0 or train1:
            feats = torch.cat([batch.hidden[t] for t in self.taps], dim=-1)  # [B, T, m*d]
            ctx_pos = torch.arange(T, device=dev)[None].expand(B, T)
            ctx_kv = self.draft.context_kv(feats, ctx_pos, model)
            mask = uniform_blocks_mask(blk["anchors"], b, self.attention, T)
            pos = blk["pos"].view(B, -1)
            logits0 = None
            if train0 or s["fill"] == "self":  # J0: the MASK pass, labels in place at every offset >= 1
                logits0 = self._pass_logits(tokens, (offsets > 0).expand(B, G, b), pos, ctx_kv, mask)  # [B, G, b-1, V]
            if train0:
                loss0, parts = self._kl(logits0, label0, has0, offsets[1:].expand(B, G, b - 1), batch)
                total = total + float(s["mask_weight"]) * loss0
                metrics.update({f"j0_{k}": v for k, v in parts.items()})
                metrics["acc"] = parts["acc"]  # the J0 pass's top-1: the column train-report compares across heads
            if train1:
                inputs, is_mask = self.refine_inputs(tokens, clean, logits0, generator)
                logits1 = self._pass_logits(inputs, is_mask, pos, ctx_kv, mask)
                loss1, parts = self._kl(logits1, blk["label_pos"][:, :, 1:], has1, blk["distance"][:, :, 1:], batch)
                total = total + float(s["refine_weight"]) * loss1
                metrics.update({f"refine_{k}": v for k, v in parts.items()})
                if s["fill"] != "mask":
                    filled = has1 & ~clean[:, :, 1:]
                    metrics["fill_acc"] = (inputs[:, :, 1:][filled] == tokens[:, :, 1:][filled]).float().mean()
        if self.adapter is not None and float(s["adapter_weight"]) > 0:
            adapter_loss, parts = self.adapter_loss(batch, blk)
            total = total + float(s["adapter_weight"]) * adapter_loss
            metrics.update(parts)
        metrics["labels"] = (has0.sum() + has1.sum()).float()
        return total, metrics

    # ---- the adapter -------------------------------------------------------------------------------
    def adapter_loss(self, batch: TargetBatch, blk: dict[str, Tensor]) -> tuple[Tensor, Metrics]:
        """Mean over taps of the position-weighted relative squared error of the predicted states."""
        assert self.adapter is not None
        B, T = batch.tokens.shape
        b = self.head_cfg.block_size
        dev = batch.device
        model = self.target.model
        d = self.target.config.hidden_size
        G = blk["anchors"].shape[1]
        valid_len = batch.valid.sum(dim=1)  # [B]
        rows = (blk["pos"] < valid_len[:, None, None]) & blk["keep"][..., None]  # [B, G, b]
        w = position_weights(b, float(self.settings["kappa"]), dev).expand(B, G, b)
        ctx_pos = torch.arange(T, device=dev)[None].expand(B, T)
        mask = uniform_blocks_mask(blk["anchors"], b, "block-causal", T)
        pos = blk["pos"].view(B, -1)
        gather_at = pos.clamp(max=T - 1)[..., None].expand(B, G * b, d)
        losses: list[Tensor] = []
        metrics: Metrics = {}
        for t in self.taps:
            module = self.adapter.tap(t)
            states = batch.hidden[t]  # [B, T, d]
            if not bool(module.stats_ready):
                seen = batch.valid.clone()
                seen[:, 0] = False  # position 0 (attention-sink states) would swamp the statistics
                module.set_stats(states[seen])
            pred = module(blk["tokens"].view(B, -1), pos, module.context_kv(states, ctx_pos, model), mask, model)
            true = states.gather(1, gather_at).view(B, G, b, d)
            rel2, cos = state_errors(pred.view(B, G, b, d), true)
            losses.append((rel2 * w)[rows].sum() / w[rows].sum().clamp_min(1e-12))
            with torch.no_grad():
                metrics[f"adapter_err_{t}"] = rel2[rows].sqrt().mean()
                metrics[f"adapter_cos_{t}"] = cos[rows].mean()
        loss = torch.stack(losses).mean()
        metrics["adapter_loss"] = loss.detach()
        return loss, metrics
