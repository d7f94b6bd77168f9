"""The verifier tests run thousands of tiny tensor ops: one intra-op thread avoids OpenMP barriers
that cost milliseconds each on a shared 2-core machine. Restored after every test."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
