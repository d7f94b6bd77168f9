"""Save and load trained heads: `head.safetensors` + `config.json` in one directory.

Storage (`storage=`), chosen to ship heads inside a small repository; every kind is dequantized at load
and only 2-D weights are quantized (1-D weights — norms, the mask embedding — stay fp32):
* "int8": one fp32 scale per output channel (row), w ~= q * scale, q = round(w / scale), scale = max|row| / 127.
* "int4" / "int3": asymmetric codes over groups of `GROUP` input columns (by default), w ~= q * scale + low
  with q in 0..2^bits - 1, fp16 scale and low per group; each group's range is shrunk to the clipping (of
  `CLIPPING`) that minimises its squared error, which trades the extremes' error for finer steps (on the
  default target's dflash head at 4 bits: 8.6 % relative error instead of 9.0 % for plain min/max). int4
  packs two codes to a byte; int3 packs eight codes into three bytes, one bit plane each. int4 is half the
  bytes of int8, what let all five heads of the default target ship together; int3 (3.5 bits a weight with
  its scales at groups of 64, 3.17 at 192, the shipped heads') is what lets deeper heads ship in the same room.
* "fp32": no quantization (training checkpoints, tests).
A file of any quantized kind is recognised by its tensors' suffixes, so heads written before int4
existed load unchanged.

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
GROUP_BITS = {"int4": 4, "int3": 3}
"""group-quantized storage kinds -> bits per code"""
GROUP = 64
STORAGE = ("int8", "int4", "int3", "fp32")
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


CLIPPING = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)  # fractions of a group's [low, high] range searched


def group_suffixes(kind: str) -> tuple[str, str, str]:
    """The names a group-quantized weight's scale, low and column count are stored under (after its own)."""
    return f".{kind}_scale", f".{kind}_low", f".{kind}_cols"


QUANT_SUFFIXES = (SCALE_SUFFIX, *(s for kind in GROUP_BITS for s in group_suffixes(kind)))


def group_params(groups: Tensor, bits: int = 4) -> tuple[Tensor, Tensor]:
    """groups [out, G, g] -> (scale, low) [out, G, 1] of the clipping (of `CLIPPING`) with the least
    squared rounding error per group on 2^bits levels; both rounded to fp16, as stored."""
    top = 2 ** bits - 1
    lo, hi = groups.amin(dim=2, keepdim=True), groups.amax(dim=2, keepdim=True)  # [out, G, 1]
    mid = (lo + hi) / 2
    best_err = best_scale = best_low = None
    for frac in CLIPPING:
        low = (mid - (mid - lo) * frac).half().float()
        scale = ((hi - lo) * frac / top).clamp_min(1e-8).half().float()
        q = torch.round((groups - low) / scale).clamp_(0, top)
        err = ((q * scale + low - groups) ** 2).sum(dim=2, keepdim=True)  # [out, G, 1]
        if best_err is None:
            best_err, best_scale, best_low = err, scale, low
        else:
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_scale, best_low = torch.where(better, scale, best_scale), torch.where(better, low, best_low)
    return best_scale, best_low


def pack_codes(q: Tensor, bits: int) -> Tensor:
    """codes [out, P] (uint8, < 2^bits) -> bytes [out, P * bits / 8]: 4 bits two to a byte (low nibble
    first); 3 bits as three bit planes of P / 8 bytes each (P a multiple of 8)."""
    rows, cols = q.shape
    if bits == 4:
        return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
    place = (1 << torch.arange(8, dtype=torch.int32))  # [8]
    eights = q.to(torch.int32).view(rows, cols // 8, 8)  # [out, P/8, 8]
    planes = [(((eights >> b) & 1) * place).sum(2) for b in range(bits)]  # bits x [out, P/8]
    return torch.stack(planes, dim=1).to(torch.uint8).view(rows, bits * cols // 8).contiguous()


def unpack_codes(codes: Tensor, bits: int) -> Tensor:
    """The inverse of `pack_codes`: bytes [out, P * bits / 8] -> codes [out, P] (uint8)."""
    rows = codes.shape[0]
    if bits == 4:
        return torch.stack([codes & 15, codes >> 4], dim=2).view(rows, -1)
    planes = codes.view(rows, bits, -1)  # [out, bits, P/8]
    shifts = torch.arange(8, dtype=torch.uint8)
    q = torch.zeros(rows, planes.shape[2], 8, dtype=torch.uint8)  # [out, P/8, 8]
    for b in range(bits):
        q |= ((planes[:, b, :, None] >> shifts) & 1) << b
    return q.view(rows, -1)


def quantize_groups(weight: Tensor, bits: int = 4, group: int = GROUP) -> tuple[Tensor, Tensor, Tensor]:
    """weight [out, in] -> (codes uint8 [out, P * bits / 8] packed by `pack_codes`, scale fp16 [out, P/g],
    low fp16 [out, P/g]), P = in rounded up to a multiple of `group` (the padding is zeros, cut off at load)."""
    if bits == 3 and group % 8:
        raise ValueError(f"int3 packs eight codes into three bytes: the group ({group}) must be a multiple of 8")
    w = weight.detach().float()
    rows, cols = w.shape
    padded = -(-cols // group) * group
    g = torch.nn.functional.pad(w, (0, padded - cols)).view(rows, padded // group, group)  # [out, G, g]
    scale, low = group_params(g, bits)
    q = torch.round((g - low) / scale).clamp_(0, 2 ** bits - 1).to(torch.uint8).view(rows, padded)  # [out, P]
    return pack_codes(q, bits), scale.squeeze(2).half(), low.squeeze(2).half()


def dequantize_groups(codes: Tensor, scale: Tensor, low: Tensor, cols: int, bits: int = 4) -> Tensor:
    """The fp32 weight [out, cols] of `quantize_groups`' output."""
    rows, groups = scale.shape
    q = unpack_codes(codes, bits).view(rows, groups, -1).float()  # [out, G, g]
    return (q * scale.float()[:, :, None] + low.float()[:, :, None]).view(rows, -1)[:, :cols]


def save_head(directory: str | Path, head: nn.Module, config: dict[str, Any], target: TargetModel, *,
              storage: str = "int8", float_dtype: torch.dtype = torch.float32) -> None:
    """Write the head's weights and `config` (plus the target's identity) into `directory`.
    storage: "int8" / "int4" / "int3" (2-D weights quantized, see the module docstring) or "fp32"; other floating
    tensors are stored in `float_dtype`."""
    save_state(directory, head.state_dict(), config, target, storage=storage, float_dtype=float_dtype)


def save_state(directory: str | Path, state: dict[str, Tensor], config: dict[str, Any], target: TargetModel, *,
               storage: str = "int8", float_dtype: torch.dtype = torch.float32,
               codes: dict[str, tuple[Tensor, Tensor, Tensor]] | None = None, group: int = GROUP) -> None:
    """`save_head` of a state dict (e.g. one `load_head` returned, to store a head in another kind).
    codes: weights already in `quantize_groups`' format at the storage's bits (e.g. rounded by
    `gptq.gptq_round`), stored as given; the other 2-D weights of a group kind round plainly in groups of
    `group` columns (the group is implied by the stored shapes, so heads of different groups load alike)."""
    from safetensors.torch import save_file

    if storage not in STORAGE:
        raise ValueError(f"head storage must be one of {', '.join(STORAGE)} (--head-storage), got {storage!r}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Tensor] = {}
    for name, t in state.items():
        t = t.detach().cpu()
        if storage == "int8" and t.ndim == 2 and t.is_floating_point():
            tensors[name], tensors[name + SCALE_SUFFIX] = quantize_int8(t)
        elif storage in GROUP_BITS and t.ndim == 2 and t.is_floating_point():
            scale_name, low_name, cols_name = (name + s for s in group_suffixes(storage))
            given = (codes or {}).get(name)
            tensors[name], tensors[scale_name], tensors[low_name] = (
                given if given is not None else quantize_groups(t, GROUP_BITS[storage], group))
            tensors[cols_name] = torch.tensor([t.shape[1]], dtype=torch.int64)
        else:
            tensors[name] = t.to(float_dtype).contiguous() if t.is_floating_point() else t.contiguous()
    meta = {
        "format_version": FORMAT_VERSION,
        "storage": storage,
        "target_name": target.name,
        "target_fingerprint": target.fingerprint,
        "head": config,
    }
    tmp = out / (WEIGHTS_FILE + ".partial")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / WEIGHTS_FILE)
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))


def load_head(directory: str | Path, target: TargetModel,
              dtype: torch.dtype | None = None) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """(state dict dequantized to `dtype`, default the target's, head config). Fails clearly on a
    missing directory or a head trained for another target."""
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
        if name.endswith(QUANT_SUFFIXES):
            continue
        scale = raw.get(name + SCALE_SUFFIX)
        kind = next((k for k in GROUP_BITS if name + group_suffixes(k)[0] in raw), None)
        if kind is not None:
            scale_name, low_name, cols_name = (name + s for s in group_suffixes(kind))
            value = dequantize_groups(t, raw[scale_name], raw[low_name], int(raw[cols_name][0]), GROUP_BITS[kind])
        else:
            value = t.float() * scale if scale is not None else t
        state[name] = value.to(dtype or target.dtype) if value.is_floating_point() else value
    return state, meta["head"]


def default_head_dir(drafter: str, target_name: str) -> Path:
    """Where a shipped head lives: specbench/heads/<drafter>-<target name>/."""
    import specbench

    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", target_name)
    return Path(specbench.__file__).parent / "heads" / f"{drafter}-{safe}"
