"""Kernel tests run on CUDA when there is one, else on the CPU under Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported: tests/conftest.py sets it (this folder
repeats it for a run rooted here).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="session")
def cuda() -> str:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return "cuda"
