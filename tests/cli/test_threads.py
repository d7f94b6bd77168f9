"""The CPU thread default for batch-1 decoding: 1 thread on a CPU unless --threads or $OMP_NUM_THREADS
says otherwise, torch's own default on CUDA; the choice is said in one line."""

from __future__ import annotations

import pytest
import torch

from specbench.cli import UsageError, set_decode_threads


@pytest.fixture(autouse=True)
def restore_threads():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_cpu_default_is_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    assert set_decode_threads(None, "cpu") == "specbench: 1 torch CPU thread (the CPU default for batch-1 decoding; " \
                                              "--threads N to change)"
    assert torch.get_num_threads() == 1


def test_flag_and_environment_override_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set_decode_threads(2, "cpu") == "specbench: 2 torch CPU threads (--threads)"
    assert torch.get_num_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert set_decode_threads(None, "cpu") == "specbench: 2 torch CPU threads ($OMP_NUM_THREADS)"
    with pytest.raises(UsageError, match="--threads must be >= 1"):
        set_decode_threads(0, "cpu")


def test_cuda_keeps_torch_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    assert set_decode_threads(None, "cuda") is None and torch.get_num_threads() == 2
