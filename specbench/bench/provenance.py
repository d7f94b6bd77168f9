"""Where a result came from: code version, package versions, hardware. Stored with every row so a
number in a table can be traced back to the commit and machine that produced it."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

PACKAGES = ("specbench", "torch", "triton", "transformers", "numpy", "pandas", "safetensors")


def git_state(directory: Path) -> dict[str, Any]:
    """Commit and dirty flag of the checkout holding `directory` (None outside a git checkout)."""
    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def device_name(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(device: str) -> dict[str, Any]:
    import specbench

    return {
        "git": git_state(Path(specbench.__file__).resolve().parent),
        "packages": package_versions(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "device_name": device_name(device),
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
