"""Save and load trained heads: `head.safetensors` + `config.json` in one directory.

int8 storage (to ship heads inside a small repository): every 2-D weight is stored as int8 with one
fp32 scale per output channel (row), w ~= q * scale with q = round(w / scale), scale = max|row| / 127,
and dequantized at load; 1-D weights (norms, the mask embedding) stay fp32.

The config records the target's fingerprint (`TargetModel.fingerprint`, equal for bf16 and fp32 loads
of one model), so a head trained on a GPU in bf16 loads on a CPU in fp32, and never on another model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from specbench.config import ConfigError
from specbench.models.target import TargetModel

WEIGHTS_FILE = "head.safetensors"
CONFIG_FILE = "config.json"
SCALE_SUFFIX = ".int8_scale"
FORMAT_VERSION = 1


class HeadCheckpointError(ConfigError):
    """A head checkpoint is missing, malformed, or made for another target; the message says what to do."""


def train_hint(drafter: str, target: TargetModel) -> str:
    """The command that trains a head for `target` (what every missing-head message suggests)."""
    return f"`specbench train --drafter {drafter} --target {target.name} --data DATA_DIR --out DIR`"


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [out, in] -> (int8 [out, in], fp32 scale [out, 1])."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-12)
    q = torch.round(w / scale).clamp_(-127, 127).to(torch.int8)
    return q, scale


def save_head(directory: str | Path, head: nn.Module, config: dict[str, Any], target: TargetModel, *, int8: bool,
              float_dtype: torch.dtype = torch.float32) -> None:
    """Write the head's weights and `config` (plus the target's identity) into `directory`.
    int8: 2-D weights as int8 + per-row scales; other floating tensors are stored in `float_dtype`."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Tensor] = {}
    for name, t in head.state_dict().items():
        t = t.detach().cpu()
        if int8 and t.ndim == 2 and t.is_floating_point():
            tensors[name], tensors[name + SCALE_SUFFIX] = quantize_int8(t)
        else:
            tensors[name] = t.to(float_dtype).contiguous() if t.is_floating_point() else t.contiguous()
    meta = {
        "format_version": FORMAT_VERSION,
        "int8": bool(int8),
        "target_name": target.name,
        "target_fingerprint": target.fingerprint,
        "head": config,
    }
    tmp = out / (WEIGHTS_FILE + ".partial")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / WEIGHTS_FILE)
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))


def load_head(directory: str | Path, target: TargetModel) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """(state dict dequantized to the target's dtype, head config). Fails clearly on a missing
    directory or a head trained for another target."""
    from safetensors.torch import load_file

    d = Path(directory)
    if not (d / CONFIG_FILE).is_file() or not (d / WEIGHTS_FILE).is_file():
        raise HeadCheckpointError(
            f"{str(d)!r} is not a head checkpoint (needs {CONFIG_FILE} and {WEIGHTS_FILE}); train one with "
            f"{train_hint('NAME', target)} and pass drafter_args checkpoint=DIR/heads/NAME", keys=("drafter_args",))
    meta = json.loads((d / CONFIG_FILE).read_text())
    if meta.get("format_version") != FORMAT_VERSION or "head" not in meta:
        raise HeadCheckpointError(f"{str(d / CONFIG_FILE)!r} has an unknown format (format_version {meta.get('format_version')!r})")
    if meta.get("target_fingerprint") != target.fingerprint:
        raise HeadCheckpointError(
            f"the head in {str(d)!r} was trained for target {meta.get('target_name')!r} (fingerprint "
            f"{meta.get('target_fingerprint')}), but the loaded target {target.name!r} has fingerprint "
            f"{target.fingerprint}: "
            f"a head only works on the model it was trained on. Train one for this target with "
            f"{train_hint(meta['head'].get('drafter', 'NAME'), target)}")
    raw = load_file(str(d / WEIGHTS_FILE))
    state: dict[str, Tensor] = {}
    for name, t in raw.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        scale = raw.get(name + SCALE_SUFFIX)
        value = t.float() * scale if scale is not None else t
        state[name] = value.to(target.dtype) if value.is_floating_point() else value
    return state, meta["head"]


def default_head_dir(drafter: str, target_name: str) -> Path:
    """Where a shipped head lives: specbench/heads/<drafter>-<target name>/."""
    import specbench

    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", target_name)
    return Path(specbench.__file__).parent / "heads" / f"{drafter}-{safe}"
