"""Sampling transforms: temperature, top-k, top-p.

The same `process_logits` is applied to the target's logits before sampling or verification, and to
draft logits wherever a verifier uses draft probabilities, so every lossless verifier is lossless
with respect to the *processed* target law. Pure: tensors in, tensors out.

Every transform treats tokens with equal logits alike (ties are kept or dropped together), so the
processed law does not depend on token ids; only greedy decoding breaks ties, by the lowest id.
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
    reaches p (the token that crosses p is kept, and so are the tokens tied with it).
    """
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits.to(dtype)
    if sampling.greedy:
        return torch.nn.functional.one_hot(x.argmax(dim=-1), x.shape[-1]).to(dtype)
    # Shift before scaling so a tiny temperature cannot overflow finite logits to inf (inf - inf = NaN).
    x = (x - x.amax(dim=-1, keepdim=True)) / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < x.shape[-1]:
        kth = torch.topk(x, sampling.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if sampling.top_p < 1.0:
        probs = top_p_filter(probs, sampling.top_p)
    return probs


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep every token whose strictly more probable tokens hold less than top_p of the mass (the
    smallest most-probable set reaching top_p, plus the tokens tied with its last one); renormalise."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # [..., V]
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # [..., V]: mass before each slot
    # A tie group's mass strictly above it is the mass before its first slot: the number of
    # strictly larger values, found by searching the ascending negated values.
    first_of_group = torch.searchsorted(-sorted_probs, -sorted_probs, right=False)  # [..., V]
    keep_sorted = mass_before.gather(-1, first_of_group) < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)
