"""Sampling transforms: temperature, top-k, top-p.

The same `process_logits` is applied to the target's logits before sampling or verification, and to
draft logits wherever a verifier uses draft probabilities, so every lossless verifier is lossless
with respect to the *processed* target law. Pure: tensors in, tensors out.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.config import SamplingConfig


def process_logits(logits: Tensor, sampling: SamplingConfig) -> Tensor:
    """logits [..., V] -> processed probabilities [..., V] in float32 (float64 stays float64).

    Greedy (temperature 0) gives the one-hot of the argmax (lowest token id among exact ties), so a
    greedy run and a sampled run use the same code path. top-k keeps the k largest logits (ties at the
    k-th value are all kept); top-p keeps the smallest prefix of the sorted distribution whose mass
    reaches p (the token that crosses p is kept).
    """
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits.to(dtype)
    if sampling.greedy:
        return torch.nn.functional.one_hot(x.argmax(dim=-1), x.shape[-1]).to(dtype)
    x = x / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < x.shape[-1]:
        kth = torch.topk(x, sampling.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if sampling.top_p < 1.0:
        probs = top_p_filter(probs, sampling.top_p)
    return probs


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most-probable tokens whose mass is >= top_p; renormalise."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass strictly before each token
    keep_sorted = mass_before < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)
