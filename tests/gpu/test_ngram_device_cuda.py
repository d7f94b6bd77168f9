"""The n-gram drafter's device path on CUDA drafts the host path's trees node for node, round after
round (`ngram_rounds.check_device_rounds`), under every policy it captures there. Run on the device:
`python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from ngram_rounds import check_device_rounds

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("tree", ["chain", "ddtree", "ddtree-vec"])
def test_cuda_drafter_drafts_the_host_tree(tree: str) -> None:
    assert check_device_rounds(torch.device("cuda"), tree, trials=40) > 40  # rounds that drafted a match
