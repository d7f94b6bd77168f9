"""Shared fixtures. The real default target (SmolLM2-135M) is loaded once per session; the first load
fetches and dequantizes it (see specbench.models.target), later loads take about a second."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2():
    from specbench.models import load_target

    return load_target("smollm2-135m", device="cpu", dtype="float32")
