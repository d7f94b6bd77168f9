"""Exact ranking: the three top-k paths against sorted(), node-order keys on special floats."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trees_reference import ranked_ids

from specbench.trees.base import DepthScores
from specbench.trees.ranking import (order_keys, ranked_topk, ranked_topk_checked, ranked_topk_keys, ranked_topk_sorted,
                                    top_indices)

SPECIAL = [0.0, -0.0, -1.0, -1.0, float("-inf"), -1e-45, -3.5, -0.5, 2.0, float("-inf")]


@st.composite
def tie_heavy_rows(draw: st.DrawFn) -> torch.Tensor:
    rows, vocab = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    values = st.sampled_from(SPECIAL) | st.floats(-5, 0, width=32)
    return torch.tensor(draw(st.lists(values, min_size=rows * vocab, max_size=rows * vocab))).view(rows, vocab)


@settings(max_examples=200, deadline=None)
@given(x=tie_heavy_rows(), k=st.integers(0, 14))
def test_every_topk_path_equals_a_sort(x: torch.Tensor, k: int) -> None:
    k_eff = min(k, x.shape[1])
    expected = [ranked_ids(row)[:k_eff] for row in x.tolist()]
    for fn in (ranked_topk_checked, ranked_topk_keys, ranked_topk_sorted):
        vals, idx = fn(x.float(), k_eff)
        assert idx.tolist() == expected, fn.__name__
        assert torch.equal(vals, x.gather(-1, idx))
    assert ranked_topk(x, k)[1].tolist() == expected


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.sampled_from(SPECIAL) | st.floats(-5, 5, width=32), min_size=1, max_size=30),
       k=st.integers(1, 30))
def test_top_indices_orders_by_value_then_position(values: list[float], k: int) -> None:
    expected = ranked_ids(values)[:k]
    assert top_indices(torch.tensor(values), k).tolist() == expected
    keys = order_keys(torch.tensor(values), torch.arange(len(values)))
    assert len(set(keys.tolist())) == len(values)  # unique, so any top-k is exact


def test_depth_scores_topk_keeps_its_api() -> None:
    logp = torch.log_softmax(torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]]), -1).double()
    tokens, vals = DepthScores(0, logp).topk(3)
    assert tokens.tolist() == [[1, 2, 0], [0, 1, 2]]
    assert vals.dtype == torch.float32 and torch.equal(vals, logp.float().gather(-1, tokens))


def test_bad_shapes_fail() -> None:
    with pytest.raises(ValueError, match="2-D"):
        ranked_topk(torch.zeros(5), 2)
