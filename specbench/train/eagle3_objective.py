"""`eagle3` objective: EAGLE-3's training-time test (docs/methods.md, "EAGLE-3 training-time test").

The head is unrolled for `ttt_steps` steps over every position of the batch at once. Row i of step s
is the entry the drafter would run when drafting s tokens past the verified context x_0..x_{i+1}:
token x_{i+1+s}, the fed-back hidden = the head's own step s-1 output at row i (step 0: the fused
target features g_i), RoPE position i+s. It attends to the step-0 keys of rows j <= i (the verified
context, exactly the drafter's cache) and to its own row's keys of steps 1..s (its ancestors among
the draft entries, and itself). Its output predicts x_{i+2+s}; the loss is the soft cross-entropy to
the target's distribution at row i+1+s restricted to the draft vocabulary, on rows whose label is a
response token and whose target argmax lies in the draft vocabulary; step s weighs step_decay**s.

Draft vocabulary: the `draft_vocab` most frequent target ids of the training data (a map d2t kept as
a buffer of the head, so it travels in the checkpoint), chosen in `prepare(token_counts)`, which the
trainer calls with the counts of the response tokens before building the optimizers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from specbench.drafters.eagle3.head import Eagle3Head, eagle3_feature_layers, select_draft_vocab, target_to_draft
from specbench.models.decoder import AttentionMeta, expand_gqa
from specbench.models.target import TargetModel
from specbench.train import OBJECTIVES
from specbench.train.objective import HeadObjective, Metrics, TargetBatch


def ttt_mask(seq_len: int, step: int, device: torch.device | str = "cpu") -> Tensor:
    """[T, (step+1)*T] bool over keys laid out [step 0 | step 1 | ... | step s]: query row i sees the
    step-0 keys j <= i and the keys of row i of steps 1..step."""
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril_()
    diagonal = torch.eye(seq_len, dtype=torch.bool, device=device)
    return torch.cat([causal] + [diagonal] * step, dim=1)


def ttt_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta | None, scale: float) -> Tensor:
    """Attention backend of the unrolled steps (reads no meta): q [B, H, T, D]; k/v [B, Hkv, (s+1)T, D]
    hold the keys of steps 0..s in blocks of T. SDPA with the `ttt_mask` (K/V heads repeated for GQA,
    so CUDA can use its memory-efficient kernel with a mask)."""
    seq_len = q.shape[2]
    step = k_cache.shape[2] // seq_len - 1
    k, v = expand_gqa(k_cache, v_cache, q.shape[1])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=ttt_mask(seq_len, step, q.device), scale=scale)


def shift_left(x: Tensor, by: int) -> Tensor:
    """[B, T, ...] -> row i holds row i+by of x; rows past the end are zeros."""
    tail = x.new_zeros(x.shape[0], min(by, x.shape[1]), *x.shape[2:])
    return torch.cat([x[:, by:], tail], dim=1)


def ttt_forward(head: Eagle3Head, embeds: Tensor, features: Tensor, steps: int) -> list[Tensor]:
    """The unrolled head. embeds [B, T, d] (row t = embedding of x_t), features [B, T, F*d] (the tapped
    target layers of row t, in head.feature_layers order) -> the head's hidden [B, T, d] per step."""
    b, t, _ = embeds.shape
    attn = head.attn
    hidden = head.fuse(features)
    positions = torch.arange(t, device=embeds.device).expand(b, t)
    k_cache: Tensor | None = None
    v_cache: Tensor | None = None
    out: list[Tensor] = []
    for s in range(steps):
        # one dtype for every step's keys: under autocast the fed-back hidden is fp32 while step 0's keys are
        # bf16, and a cat of the two would promote the caches (and SDPA's inputs) to fp32 from step 1 on
        blank = (hidden if k_cache is None else k_cache).new_zeros(b, attn.n_kv, t, attn.head_dim)
        k_cache = blank if k_cache is None else torch.cat([k_cache, blank], dim=2)  # a fresh buffer per step
        v_cache = blank.clone() if v_cache is None else torch.cat([v_cache, blank], dim=2)
        slots = (s * t + torch.arange(t, device=embeds.device)).expand(b, t)
        hidden = head(shift_left(embeds, 1 + s), hidden, positions + s, k_cache, v_cache, slots, None, ttt_attention)
        out.append(hidden)
    return out


def _plain(x: Tensor) -> Tensor:
    """Inference-mode tensors (a target run under torch.inference_mode) cannot be saved for backward."""
    return x.clone() if x.is_inference() else x


@OBJECTIVES.register("eagle3")
class Eagle3Objective(HeadObjective):
    """Config: draft_vocab (0 = the whole target vocabulary), ttt_steps, step_decay, feature_layers
    (default: EAGLE-3's low/mid/high taps), seed (weight init)."""

    name = "eagle3"
    drafter = "eagle3"

    def __init__(self, target: TargetModel, *, draft_vocab: int = 4096, ttt_steps: int = 7, step_decay: float = 0.8,
                 feature_layers: list[int] | None = None, seed: int = 0) -> None:
        super().__init__(target)
        cfg = target.config
        if ttt_steps < 1:
            raise ValueError(f"ttt_steps must be >= 1, got {ttt_steps}")
        if not 0 < step_decay <= 1:
            raise ValueError(f"step_decay must be in (0, 1], got {step_decay}")
        layers = tuple(feature_layers) if feature_layers is not None else eagle3_feature_layers(cfg.num_layers)
        size = draft_vocab or cfg.vocab_size
        self.head = Eagle3Head(cfg, layers, size).to(target.device)
        self.taps = tuple(sorted(set(layers)))
        self.ttt_steps, self.step_decay, self.seed = ttt_steps, step_decay, seed
        self.vocab_ready = size == cfg.vocab_size
        self.head.init_weights(target.model, seed)

    def prepare(self, token_counts: Tensor) -> None:
        """Choose the draft vocabulary from counts [V] of the training tokens, then (re)initialise the
        head's weights, whose LM head rows are copied from the target's at the chosen ids. Call it
        before the first step of a fresh run (a resumed run restores d2t from its checkpoint)."""
        counts = torch.as_tensor(token_counts)
        if counts.numel() != self.target.config.vocab_size:
            raise ValueError(f"token_counts has {counts.numel()} entries; the target's vocabulary has "
                             f"{self.target.config.vocab_size}")
        self.head.set_draft_vocab(select_draft_vocab(counts, self.head.draft_vocab))
        self.head.init_weights(self.target.model, self.seed)
        self.vocab_ready = True

    def head_config(self) -> dict[str, Any]:
        return {**self.head.head_config(),
                "train": {"ttt_steps": self.ttt_steps, "step_decay": self.step_decay}}

    def loss(self, batch: TargetBatch, generator: torch.Generator) -> tuple[Tensor, Metrics]:
        if not self.vocab_ready:
            raise RuntimeError(
                "eagle3: the draft vocabulary is not chosen: call prepare(token_counts) (the trainer does) before "
                "the first step, or build the objective with draft_vocab=0 for the whole vocabulary")
        head, target = self.head, self.target
        t = batch.seq_len
        embeds = target.model.embed(batch.tokens)  # [B, T, d], frozen
        features = torch.cat([_plain(batch.hidden[layer]) for layer in head.feature_layers], dim=-1)
        hiddens = ttt_forward(head, embeds, features, self.ttt_steps)
        target_logits = _plain(batch.target_logits)
        in_vocab = target_to_draft(head.d2t, target.config.vocab_size)[target_logits.argmax(-1)] >= 0  # [B, T]
        teacher = F.softmax(target_logits[..., head.d2t].float(), dim=-1)  # [B, T, K]
        total = hiddens[0].new_zeros((), dtype=torch.float32)
        parts: list[Tensor] = []
        for s, hidden in enumerate(hiddens):
            m = t - 2 - s  # rows i with a label x_{i+2+s} inside the sequence
            if m < 1:
                break
            rows = batch.loss_mask[:, 2 + s:] & in_vocab[:, 1 + s: t - 1]  # [B, m]
            student = F.log_softmax(head.logits(hidden[:, :m][rows]).float(), dim=-1)  # [M, K]
            p = teacher[:, 1 + s: t - 1][rows]  # [M, K]
            count = rows.sum().clamp_min(1)
            ce = -(p * student).sum() / count
            acc = (student.argmax(-1) == p.argmax(-1)).float().sum() / count
            total = total + self.step_decay ** s * ce
            parts.extend([ce.detach(), acc.detach()])
        metrics: Metrics = {"loss": total.detach()}
        for s in range(len(parts) // 2):
            metrics[f"ce{s}"], metrics[f"acc{s}"] = parts[2 * s], parts[2 * s + 1]
        if parts:  # mean top-1 agreement with the target over the unrolled steps
            metrics["acc"] = torch.stack(parts[1::2]).mean()
        return total, metrics
