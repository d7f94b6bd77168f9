"""Forward KL between a draft head's logits and the target's, per row, in one pass forward and one backward.

The heads' distillation loss (`specbench.train.losses.forward_kl`) over [M, V] rows with V = 49,152 is a
chain of element-wise ops in autograd: two log-softmaxes, exp, sub, mul, sum forward, and their backward,
each a pass over [M, V] fp32. On the H200 that chain was about a fifth of a training step's device time
(2026-12-03, docs/measurements/README.md). Here:

  forward   one program per row streams the student and teacher logits once, with online softmax sums:
            lse_q, lse_p and a = sum_v P_v (p_v - s_v), so kl = a - lse_p + lse_q
            (s = student / T, p = teacher / T, P = softmax(p), Q = softmax(s))
  backward  d kl / d student = (Q - P) / T, one element-wise pass from the saved lse_q, lse_p

Inputs: student and teacher [M, V] (fp32/bf16/fp16, unit column stride, any row stride); the sums are fp32.
A teacher entry of -inf has P = 0 and adds nothing. Reference: `reference.forward_kl_rows_reference`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specbench.kernels.device import require_kernel_device

BLOCK_V = 2048  # vocabulary entries per loop step (forward) and per program (backward)


@triton.jit
def _fkl_forward_kernel(S, P, KL, LseQ, LseP, V, stride_s, stride_p, inv_t, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    m_q = tl.full([BLOCK], float("-inf"), tl.float32)  # per-lane running max and sums, merged at the end
    l_q = tl.zeros([BLOCK], tl.float32)
    m_p = tl.full([BLOCK], float("-inf"), tl.float32)
    l_p = tl.zeros([BLOCK], tl.float32)
    a_p = tl.zeros([BLOCK], tl.float32)  # sum of e^(p - m_p) (p - s)
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        ok = offs < V
        s = tl.load(S + row * stride_s + offs, mask=ok, other=0.0).to(tl.float32) * inv_t
        p = tl.load(P + row * stride_p + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
        s_in = tl.where(ok, s, float("-inf"))  # lanes past V count in no sum
        new_q = tl.maximum(m_q, s_in)
        safe_q = tl.where(new_q == float("-inf"), 0.0, new_q)
        l_q = l_q * tl.exp(m_q - safe_q) + tl.exp(s_in - safe_q)
        m_q = new_q
        new_p = tl.maximum(m_p, p)
        safe_p = tl.where(new_p == float("-inf"), 0.0, new_p)
        keep = tl.exp(m_p - safe_p)
        e = tl.exp(p - safe_p)  # [BLOCK]; 0 where p = -inf
        a_p = a_p * keep + e * tl.where(e > 0, p - s, 0.0)
        l_p = l_p * keep + e
        m_p = new_p
    mq = tl.max(m_q, 0)
    lq = tl.sum(tl.where(m_q == float("-inf"), 0.0, l_q * tl.exp(m_q - mq)), 0)
    mp = tl.max(m_p, 0)
    scale = tl.where(m_p == float("-inf"), 0.0, tl.exp(m_p - mp))
    lp = tl.sum(l_p * scale, 0)
    ap = tl.sum(a_p * scale, 0)
    lse_q = mq + tl.log(lq)
    lse_p = mp + tl.log(lp)
    tl.store(KL + row, ap / lp - lse_p + lse_q)
    tl.store(LseQ + row, lse_q)
    tl.store(LseP + row, lse_p)


@triton.jit
def _fkl_backward_kernel(S, P, G, LseQ, LseP, Out, V, stride_s, stride_p, stride_o, inv_t, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < V
    s = tl.load(S + row * stride_s + offs, mask=ok, other=0.0).to(tl.float32) * inv_t
    p = tl.load(P + row * stride_p + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
    q_prob = tl.exp(s - tl.load(LseQ + row))
    p_prob = tl.exp(p - tl.load(LseP + row))
    grad = tl.load(G + row) * inv_t * (q_prob - p_prob)  # [BLOCK]
    tl.store(Out + row * stride_o + offs, grad.to(Out.dtype.element_ty), mask=ok)


def _check(student: Tensor, teacher: Tensor) -> None:
    require_kernel_device(student)
    if student.dim() != 2 or student.shape != teacher.shape:
        raise ValueError(f"student and teacher must be [M, V] of one shape, got {tuple(student.shape)} and "
                         f"{tuple(teacher.shape)}")
    if student.stride(1) != 1 or teacher.stride(1) != 1:
        raise ValueError("student and teacher need a unit column stride")


def forward_kl_rows(student: Tensor, teacher: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """KL(softmax(teacher / T) || softmax(student / T)) per row [M] fp32, with lse_q and lse_p [M] (for
    `forward_kl_rows_grad`)."""
    _check(student, teacher)
    m, v = student.shape
    kl, lse_q, lse_p = (torch.empty(m, device=student.device, dtype=torch.float32) for _ in range(3))
    if m:
        _fkl_forward_kernel[(m,)](student, teacher, kl, lse_q, lse_p, v, student.stride(0), teacher.stride(0),
                                  1.0 / float(temperature), BLOCK=BLOCK_V)
    return kl, lse_q, lse_p


def forward_kl_rows_grad(student: Tensor, teacher: Tensor, grad_rows: Tensor, lse_q: Tensor, lse_p: Tensor,
                         temperature: float = 1.0) -> Tensor:
    """d(sum_r grad_rows[r] * kl[r]) / d student [M, V], in the student's dtype."""
    _check(student, teacher)
    m, v = student.shape
    out = torch.empty_like(student, memory_format=torch.contiguous_format)
    if m:
        _fkl_backward_kernel[(m, triton.cdiv(v, BLOCK_V))](
            student, teacher, grad_rows.float().contiguous(), lse_q, lse_p, out, v, student.stride(0),
            teacher.stride(0), out.stride(0), 1.0 / float(temperature), BLOCK=BLOCK_V)
    return out
