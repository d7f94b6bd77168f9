"""The verifier tests run thousands of tiny tensor ops: one intra-op thread (tests/conftest.py's
`single_thread`) avoids OpenMP barriers that cost milliseconds each on a shared 2-core machine."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def one_thread(single_thread: None) -> None:
    return None
