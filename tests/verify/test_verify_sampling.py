"""Sampling transforms (temperature, top-k, top-p) against a brute-force definition, with exact ties,
-inf logits (zeros), tiny temperatures and batches."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specbench.config import SamplingConfig
from specbench.verify.sampling import process_logits


def brute_force(logits: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    """The definition, token by token, in float64 with Python floats."""
    v = len(logits)
    if temperature == 0:
        best = max(range(v), key=lambda i: (logits[i], -i))
        return [1.0 if i == best else 0.0 for i in range(v)]
    x = list(logits)
    if 0 < top_k < v:
        kth = sorted(x, reverse=True)[top_k - 1]
        x = [xi if xi >= kth else -math.inf for xi in x]
    m = max(x)
    w = [math.exp((xi - m) / temperature) if xi > -math.inf else 0.0 for xi in x]
    p = [wi / sum(w) for wi in w]
    if top_p < 1.0:
        p = [pi if sum(pj for pj in p if pj > pi) < top_p else 0.0 for pi in p]
        p = [pi / sum(p) for pi in p]
    return p


logit_values = st.sampled_from([-math.inf, -3.0, -1.0, 0.0, 0.5, 1.0, 2.0, 2.0, 7.0])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    logits=st.lists(logit_values, min_size=2, max_size=7).filter(lambda xs: max(xs) > -math.inf),
    temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]),
    top_k=st.integers(0, 8),
    top_p=st.sampled_from([1.0, 0.9, 0.5, 0.3, 1e-6]),
)
def test_matches_brute_force(logits, temperature, top_k, top_p) -> None:
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    got = process_logits(torch.tensor(logits, dtype=torch.float64), sampling)
    want = brute_force(logits, temperature, top_k, top_p)
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=1e-12, rtol=0)
    assert (got == 0).tolist() == [w == 0 for w in want]  # the same support, exactly


def test_ties_are_kept_together_and_ids_do_not_matter() -> None:
    """Exact ties at the top-k / top-p boundary are kept or dropped together, so permuting token ids
    permutes the processed law."""
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([[1.0, 1.0, 1.0, 0.0], [2.0, 1.0, 1.0, 1.0], [0.0, 3.0, 3.0, -math.inf]])
    for sampling in (SamplingConfig(1.0, top_p=0.5), SamplingConfig(1.0, top_k=2), SamplingConfig(0.7, top_k=2, top_p=0.6)):
        probs = process_logits(logits, sampling)
        assert torch.equal(probs[0, :3], probs[0, :3].flip(0)) and torch.equal(probs[1, 1:], probs[1, 1:].flip(0))
        for _ in range(5):
            perm = torch.randperm(4, generator=g)
            assert torch.allclose(process_logits(logits[:, perm], sampling), probs[:, perm], atol=1e-7)
    kept = process_logits(torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64), SamplingConfig(1.0, top_p=0.5))
    assert torch.allclose(kept, torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0], dtype=torch.float64), atol=1e-15)


def test_greedy_breaks_ties_by_lowest_id() -> None:
    probs = process_logits(torch.tensor([[0.0, 5.0, 5.0], [5.0, 5.0, 5.0]]), SamplingConfig(temperature=0.0))
    assert probs.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_tiny_temperature_is_finite() -> None:
    probs = process_logits(torch.tensor([30.0, 29.0, 30.0, -math.inf]), SamplingConfig(temperature=1e-40))
    assert probs.tolist() == [0.5, 0.0, 0.5, 0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_batched_rows_equal_single_rows_and_sum_to_one(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    logits = (4 * torch.randn(6, 50, generator=g)).to(dtype)
    logits[:, ::5] = logits[:, 1:2]  # ties
    sampling = SamplingConfig(temperature=0.8, top_k=20, top_p=0.7)
    batched = process_logits(logits, sampling)
    assert batched.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    for i in range(6):
        assert torch.equal(batched[i], process_logits(logits[i], sampling))
    assert torch.allclose(batched.sum(-1), torch.ones(6, dtype=batched.dtype))
    assert ((batched > 0).sum(-1) <= 20 + 10).all()  # top-k (plus ties) bounds the support
