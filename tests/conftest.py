"""Shared fixtures and the `--components` option.

The real default target (SmolLM2-135M) is loaded once per session; the first load fetches and
dequantizes it (see specbench.models.target), later loads take about a second.

`--components MODULE` (repeatable) imports MODULE (a dotted path on sys.path) before collection, so
the components it registers join the registry-driven suites (tests/components.py): the way to run
the proofs and tests on a drafter, tree policy or verifier that lives outside specbench.
"""

from __future__ import annotations

import importlib
import os
from typing import Iterator

import pytest
import torch

# Triton decides at decoration time whether a @triton.jit function (its own tl.* library included) runs
# under the interpreter, so TRITON_INTERPRET must be set before anything imports triton: torch imports it
# lazily (e.g. torch._dynamo, from a test module that builds a model at import), hence here, first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--components", action="append", default=[], metavar="MODULE",
                     help="import MODULE before collection: the components it registers join the registry-driven tests")


def pytest_configure(config: pytest.Config) -> None:
    for module in config.getoption("components"):
        importlib.import_module(module)


@pytest.fixture(scope="session")
def smollm2():
    from specbench.models import load_target

    return load_target("smollm2-135m", device="cpu", dtype="float32")


@pytest.fixture
def single_thread() -> Iterator[None]:
    """One intra-op thread for the test, restored after it: small tensor ops on a shared 2-core machine
    lose more to OpenMP barriers than they gain from a second thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
