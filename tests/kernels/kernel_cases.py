"""Random inputs and error measures shared by the kernel tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor


def load_script(name: str) -> ModuleType:
    """scripts/NAME.py as a module (the benchmark scripts are not a package)."""
    path = Path(__file__).resolve().parents[2] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def random_parents(n: int, generator: torch.Generator, max_back: int | None = None) -> Tensor:
    """[n] parent ids (root -1, parents[i] < i); max_back bounds i - parent (deeper, chain-like trees)."""
    par = [-1]
    for i in range(1, n):
        lo = 0 if max_back is None else max(0, i - max_back)
        par.append(int(torch.randint(lo, i, (1,), generator=generator)))
    return torch.tensor(par, dtype=torch.long)


def ancestor_mask(parents: Tensor) -> Tensor:
    """[n, n] bool: row i marks i and its ancestors."""
    n = parents.numel()
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def rel_err(got: Tensor, ref: Tensor) -> float:
    """||got - ref|| / ||ref|| in float64; NaN anywhere gives inf."""
    got, ref = got.double(), ref.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2 if torch.cuda.is_available() else 3e-2}  # interpreter casts truncate


def exact_casts(device: str, dtype: torch.dtype) -> bool:
    """Whether a kernel's dtype casts round as PyTorch's do (fp32, or CUDA; the interpreter's bf16 casts truncate)."""
    return dtype == torch.float32 or device == "cuda"


def foresight_round(target, tree: str, budget: int, prompt: list[int], ar: list[int], variant: str) -> tuple:  # type: ignore[no-untyped-def]
    """One greedy request of jetspec++ with device foresight (random head, J1 R1, B 4, sequential pipeline) on
    `target` as configured now; checks it emits `ar`. Returns (every round's tree tokens + parents, the last
    foresight stage's candidate tokens and parents): what two configurations of one round must agree on."""
    from specbench.config import SpecConfig
    from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
    from specbench.engine import SpecDecoder

    drafter = JetSpecPPDrafter(target, random_init=True, J=1, R=1, foresight="on", B=4, pipeline="sequential")
    dec = SpecDecoder(target, SpecConfig(drafter="jetspec++", tree=tree, budget=budget), max_seq_len=96, drafter=drafter)
    assert dec.branching
    trees: list[list[int]] = []
    res = dec.generate(prompt, len(ar), on_round=lambda i, t, r: trees.append(t.tokens.tolist() + t.parents.tolist()))
    assert res.tokens == ar, variant
    fs = drafter.device_foresight
    assert fs is not None
    return trees, fs.cand["tokens"].tolist(), fs.cand["parents"].tolist()
