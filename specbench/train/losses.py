"""Per-row distillation losses between a draft head's logits and the frozen target's.

Every function takes rows already gathered ([M, V] student logits, [M, V] teacher logits, [M] labels)
and per-row weights [M] (e.g. the exp(-(k-1)/gamma) position decay, zero for rows to ignore), and
returns the weighted mean. Computed in fp32 whatever the logits' dtype.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor


def position_decay(distance: Tensor, gamma: float | None) -> Tensor:
    """exp(-(k - 1) / gamma) for the k-th predicted position after the last known token (k >= 1);
    gamma None or <= 0 = no decay (all ones)."""
    if gamma is None or gamma <= 0:
        return torch.ones_like(distance, dtype=torch.float32)
    return torch.exp(-(distance.float() - 1.0) / gamma)


def _weighted_mean(per_row: Tensor, weights: Tensor) -> Tensor:
    total = weights.sum()
    return (per_row * weights).sum() / total.clamp_min(1e-12)


def cross_entropy(student: Tensor, labels: Tensor, weights: Tensor) -> Tensor:
    """Weighted CE of the hard labels (the tokens the target generated)."""
    return _weighted_mean(F.cross_entropy(student.float(), labels, reduction="none"), weights)


class _FusedForwardKL(torch.autograd.Function):
    """Per-row forward KL by `specbench.kernels.kl_loss` (one pass forward, one backward, nothing [M, V] saved
    but the inputs): the autograd chain of `forward_kl_rows` was ~a fifth of a training step on the H200."""

    @staticmethod
    def forward(ctx, student: Tensor, teacher: Tensor, temperature: float) -> Tensor:  # type: ignore[override]
        from specbench.kernels.kl_loss import forward_kl_rows

        kl, lse_q, lse_p = forward_kl_rows(student, teacher, temperature)
        ctx.save_for_backward(student, teacher, lse_q, lse_p)
        ctx.temperature = temperature
        return kl

    @staticmethod
    def backward(ctx, grad_kl: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        from specbench.kernels.kl_loss import forward_kl_rows_grad

        student, teacher, lse_q, lse_p = ctx.saved_tensors
        return forward_kl_rows_grad(student, teacher, grad_kl, lse_q, lse_p, ctx.temperature), None, None


def fused_kl_applies(student: Tensor, teacher: Tensor) -> bool:
    """The kernel path: CUDA rows [M, V] with unit column stride and a teacher that needs no gradient
    (SPECBENCH_FUSED_KL=0 turns it off, e.g. to time the two; any value but 0 or 1 is refused)."""
    setting = os.environ.get("SPECBENCH_FUSED_KL", "1")
    if setting not in ("0", "1"):
        raise ValueError(f"SPECBENCH_FUSED_KL={setting!r}: set it to 1 (the fused kernels on CUDA) or 0 (the autograd chain)")
    return (setting == "1" and student.is_cuda and teacher.is_cuda and student.dim() == 2
            and student.shape == teacher.shape and student.stride(1) == 1 and teacher.stride(1) == 1
            and not teacher.requires_grad)


def forward_kl_rows(student: Tensor, teacher: Tensor, temperature: float = 1.0) -> Tensor:
    """KL(p_teacher^T || q_student^T) per row [M] fp32, differentiable in the student: the fused kernels on
    CUDA (`fused_kl_applies`), the autograd chain elsewhere."""
    t = float(temperature)
    if fused_kl_applies(student, teacher):
        return _FusedForwardKL.apply(student, teacher, t)
    log_q = F.log_softmax(student.float() / t, dim=-1)
    log_p = F.log_softmax(teacher.float() / t, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def forward_kl(student: Tensor, teacher: Tensor, weights: Tensor, temperature: float = 1.0) -> Tensor:
    """T^2 * KL(p_teacher^T || q_student^T) (Hinton scaling keeps gradients comparable across T);
    mass-covering: the head learns the target's whole next-token law."""
    t = float(temperature)
    return _weighted_mean(forward_kl_rows(student, teacher, t), weights) * t * t


def reverse_kl(student: Tensor, teacher: Tensor, weights: Tensor, temperature: float = 1.0) -> Tensor:
    """T^2 * KL(q_student^T || p_teacher^T): mode-seeking."""
    t = float(temperature)
    log_q = F.log_softmax(student.float() / t, dim=-1)
    log_p = F.log_softmax(teacher.float() / t, dim=-1)
    kl = (log_q.exp() * (log_q - log_p)).sum(-1)
    return _weighted_mean(kl, weights) * t * t


LOSSES = ("ce", "fkl", "rkl")


def combined_loss(student: Tensor, teacher: Tensor, labels: Tensor, weights: Tensor,
                  loss_weights: dict[str, float], temperature: float = 1.0) -> tuple[Tensor, dict[str, Tensor]]:
    """sum_i loss_weights[i] * loss_i over the named losses (ce, fkl, rkl), with the parts as metrics
    (detached 0-d tensors)."""
    unknown = set(loss_weights) - set(LOSSES)
    if unknown:
        raise ValueError(f"unknown loss(es) {sorted(unknown)}; choose from {LOSSES}")
    total = student.new_zeros((), dtype=torch.float32)
    metrics: dict[str, Tensor] = {}
    for name, w in loss_weights.items():
        if w == 0:
            continue
        if name == "ce":
            part = cross_entropy(student, labels, weights)
        elif name == "fkl":
            part = forward_kl(student, teacher, weights, temperature)
        else:
            part = reverse_kl(student, teacher, weights, temperature)
        total = total + w * part
        metrics[name] = part.detach()
    if not metrics:
        raise ValueError("every loss weight is zero: give at least one of ce, fkl, rkl a positive weight")
    return total, metrics
