"""The fused forward-KL kernels equal their float64 reference and the training loss's autograd chain, in value
and gradient: rows wider than one block, a temperature, bf16 logits, a row stride and -inf teacher entries."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.kernels.kl_loss import BLOCK_V, forward_kl_rows, forward_kl_rows_grad  # noqa: E402
from specbench.kernels.reference import forward_kl_rows_grad_reference, forward_kl_rows_reference  # noqa: E402
from specbench.train.losses import _FusedForwardKL, forward_kl, forward_kl_rows as chain_rows  # noqa: E402


def _logits(rows: int, vocab: int, seed: int, scale: float = 4.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * scale


@pytest.mark.parametrize("rows, vocab, t", [(3, 2 * BLOCK_V + 77, 1.0), (2, 300, 2.0), (4, BLOCK_V, 0.7)])
def test_forward_and_grad_equal_the_reference(device, rows, vocab, t) -> None:
    s, p = _logits(rows, vocab, 1 + vocab), _logits(rows, vocab, 2 + vocab, scale=6.0)
    kl, lse_q, lse_p = forward_kl_rows(s.to(device), p.to(device), t)
    want_kl, want_q, want_p = forward_kl_rows_reference(s, p, t)
    torch.testing.assert_close(kl.cpu(), want_kl, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse_q.cpu(), want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse_p.cpu(), want_p, rtol=1e-5, atol=1e-5)
    g = torch.linspace(0.5, 2.0, rows)
    grad = forward_kl_rows_grad(s.to(device), p.to(device), g.to(device), lse_q, lse_p, t)
    torch.testing.assert_close(grad.cpu(), forward_kl_rows_grad_reference(s, p, g, t), rtol=1e-4, atol=1e-7)


def test_masked_teacher_entries_a_row_stride_and_bf16(device) -> None:
    wide_s, wide_p = _logits(3, 1200, 7), _logits(3, 1200, 8)
    s, p = wide_s[:, :1000], wide_p[:, 100:1100]  # row strides of 1200
    p[:, ::5] = float("-inf")  # P = 0 there: no term, no NaN
    s16 = s.to(torch.bfloat16)
    kl, lse_q, lse_p = forward_kl_rows(s16.to(device), p.to(device))
    want, _, _ = forward_kl_rows_reference(s16, p)
    assert torch.isfinite(kl).all()
    torch.testing.assert_close(kl.cpu(), want, rtol=1e-4, atol=1e-5)
    grad = forward_kl_rows_grad(s16.to(device), p.to(device), torch.ones(3, device=device), lse_q, lse_p)
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad.cpu().float(), forward_kl_rows_grad_reference(s16, p, torch.ones(3)).float(),
                               rtol=2e-2, atol=1e-4)


def test_identical_rows_have_zero_kl_and_zero_grad(device) -> None:
    s = _logits(2, 900, 3)
    kl, lse_q, lse_p = forward_kl_rows(s.to(device), s.clone().to(device))
    assert kl.abs().max().item() < 1e-5
    grad = forward_kl_rows_grad(s.to(device), s.to(device), torch.ones(2, device=device), lse_q, lse_p)
    assert grad.abs().max().item() < 1e-6


def test_autograd_function_matches_the_loss_chain(device) -> None:
    """The loss's fused path (what CUDA training runs) against the chain: the weighted loss and d/d student."""
    s, p = _logits(5, 700, 11), _logits(5, 700, 12)
    w = torch.tensor([1.0, 0.0, 0.5, 2.0, 1.0])
    t = 1.5
    a = s.clone().to(device).requires_grad_()
    fused = (_FusedForwardKL.apply(a, p.to(device), t) * w.to(device)).sum() / w.sum() * t * t
    fused.backward()
    b = s.clone().requires_grad_()
    chain = forward_kl(b, p, w, t)  # on the CPU: the autograd chain
    chain.backward()
    torch.testing.assert_close(fused.detach().cpu(), chain.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(chain_rows(s, p, t), forward_kl_rows_reference(s, p, t)[0], rtol=1e-5, atol=1e-6)  # CPU: the chain


def test_bad_shapes_fail_with_a_message(device) -> None:
    with pytest.raises(ValueError, match=r"\[M, V\]"):
        forward_kl_rows(torch.zeros(2, 8, device=device), torch.zeros(2, 9, device=device))
    with pytest.raises(ValueError, match="unit column stride"):
        forward_kl_rows(torch.zeros(8, 2, device=device).T, torch.zeros(2, 8, device=device))


def test_fused_kl_setting_is_checked(monkeypatch) -> None:
    from specbench.train.losses import fused_kl_applies

    x = torch.zeros(2, 8)
    monkeypatch.setenv("SPECBENCH_FUSED_KL", "off")
    with pytest.raises(ValueError, match="SPECBENCH_FUSED_KL='off'"):
        fused_kl_applies(x, x)
    monkeypatch.setenv("SPECBENCH_FUSED_KL", "1")
    assert not fused_kl_applies(x, x)  # CPU rows: the chain
