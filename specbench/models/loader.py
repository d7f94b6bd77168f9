"""Weights in and out: Hugging Face directories, GGUF files (dequantized once, cached as safetensors),
and random initialisation from a config.

Hugging Face tensor names are mapped onto the native decoder's fused projections (q|k|v -> wqkv,
gate|up -> w_gate_up) once, at load time.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from torch import Tensor

from specbench.models.config import ModelConfig
from specbench.models.decoder import Transformer


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says what to do."""


def cache_root() -> Path:
    """The user cache: $SPECBENCH_CACHE, else $XDG_CACHE_HOME/specbench, else ~/.cache/specbench."""
    if os.environ.get("SPECBENCH_CACHE"):
        return Path(os.environ["SPECBENCH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specbench"


def log(msg: str) -> None:
    print(f"specbench: {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# State dict mapping
# --------------------------------------------------------------------------------------------
def hf_to_native(cfg: ModelConfig, sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Hugging Face LlamaForCausalLM/Qwen2/Qwen3 tensor names -> native decoder names."""
    def get(name: str) -> Tensor:
        for key in (name, name.removeprefix("model.")):
            if key in sd:
                return sd[key]
        raise ModelLoadError(f"checkpoint is missing tensor {name!r}; is this a {cfg.family} checkpoint?")

    out: dict[str, Tensor] = {"embed.weight": get("model.embed_tokens.weight"), "norm.weight": get("model.norm.weight")}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"] if "lm_head.weight" in sd else get("model.embed_tokens.weight")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        q, k, v = (get(p + f"self_attn.{x}_proj.weight") for x in "qkv")
        out[f"layers.{i}.attn.wqkv.weight"] = torch.cat([q, k, v], dim=0)
        if cfg.qkv_bias:
            out[f"layers.{i}.attn.wqkv.bias"] = torch.cat([get(p + f"self_attn.{x}_proj.bias") for x in "qkv"], dim=0)
        out[f"layers.{i}.attn.wo.weight"] = get(p + "self_attn.o_proj.weight")
        if cfg.qk_norm:
            out[f"layers.{i}.attn.q_norm.weight"] = get(p + "self_attn.q_norm.weight")
            out[f"layers.{i}.attn.k_norm.weight"] = get(p + "self_attn.k_norm.weight")
        out[f"layers.{i}.mlp.w_gate_up.weight"] = torch.cat(
            [get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")], dim=0)
        out[f"layers.{i}.mlp.w_down.weight"] = get(p + "mlp.down_proj.weight")
        out[f"layers.{i}.attn_norm.weight"] = get(p + "input_layernorm.weight")
        out[f"layers.{i}.mlp_norm.weight"] = get(p + "post_attention_layernorm.weight")
    return out


def native_to_hf(cfg: ModelConfig, sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of `hf_to_native` (for saving and for building transformers' reference model)."""
    q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    out: dict[str, Tensor] = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.num_layers):
        p, n = f"model.layers.{i}.", f"layers.{i}."
        for x, t in zip("qkv", sd[n + "attn.wqkv.weight"].split([q_dim, kv_dim, kv_dim])):
            out[p + f"self_attn.{x}_proj.weight"] = t
        if cfg.qkv_bias:
            for x, t in zip("qkv", sd[n + "attn.wqkv.bias"].split([q_dim, kv_dim, kv_dim])):
                out[p + f"self_attn.{x}_proj.bias"] = t
        out[p + "self_attn.o_proj.weight"] = sd[n + "attn.wo.weight"]
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = sd[n + "attn.q_norm.weight"]
            out[p + "self_attn.k_norm.weight"] = sd[n + "attn.k_norm.weight"]
        gate, up = sd[n + "mlp.w_gate_up.weight"].chunk(2, dim=0)
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate, up
        out[p + "mlp.down_proj.weight"] = sd[n + "mlp.w_down.weight"]
        out[p + "input_layernorm.weight"] = sd[n + "attn_norm.weight"]
        out[p + "post_attention_layernorm.weight"] = sd[n + "mlp_norm.weight"]
    return {k: v.contiguous() for k, v in out.items()}


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------
def build_model(cfg: ModelConfig, state_dict: Mapping[str, Tensor] | None, *, dtype: torch.dtype,
                device: str | torch.device, attention: str = "auto", seed: int = 0,
                fused: str | bool | None = None) -> Transformer:
    """A Transformer with the given native state dict (or seeded random weights when None).

    attention "auto": on CUDA $SPECBENCH_ATTENTION if set, else the Triton tree-attention kernel ("triton"); SDPA
    elsewhere. fused: the `Transformer.set_fused` level (None: $SPECBENCH_FUSED_LEVEL if set, else
    `CUDA_FUSED_LEVEL`, on CUDA; "reference" elsewhere), so one environment variable switches every script's
    target between levels (or attention backends) for a same-machine comparison."""
    on_cuda = torch.device(device).type == "cuda"
    env_attention = attention_from_env()  # checked on every device
    if attention == "auto":
        attention = (env_attention or "triton") if on_cuda else "sdpa"
    with torch.device("meta"):
        model = Transformer(cfg, attention=attention)
    if state_dict is None:
        model = model.to_empty(device=device)
        init_random_(model, seed)
    else:
        model = model.to_empty(device=device)
        missing, unexpected = model.load_state_dict(dict(state_dict), strict=False)
        missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
        if missing or unexpected:
            raise ModelLoadError(f"checkpoint does not fit the {cfg.family} config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model = model.to(dtype=dtype).eval().requires_grad_(False)
    # RoPE frequencies stay fp32: a bf16 copy is off by radians at position ~2000.
    model.inv_freq = _inv_freq(cfg).to(model.embed.weight.device)
    if fused is None:  # on CUDA the environment's level (checked on every device), else the default (True)
        env = fused_level_from_env()
        fused = (env or True) if on_cuda else False
    model.set_fused(fused)
    return model


def fused_level_from_env() -> str | None:
    """$SPECBENCH_FUSED_LEVEL (None when unset or empty), refused at once if it names no level."""
    from specbench.models.decoder import FUSED_LEVELS

    level = os.environ.get("SPECBENCH_FUSED_LEVEL", "").strip() or None
    if level is not None and level not in FUSED_LEVELS:
        raise ValueError(f"SPECBENCH_FUSED_LEVEL={level!r} is not a fused level; set it to one of {', '.join(FUSED_LEVELS)} "
                         "or unset it")
    return level


def attention_from_env() -> str | None:
    """$SPECBENCH_ATTENTION (None when unset or empty): the backend "auto" means on CUDA, refused at once if it
    names none (the pipeline sets it to the backend its kernels phase timed faster)."""
    from specbench.models.decoder import ATTENTION_BACKENDS

    name = os.environ.get("SPECBENCH_ATTENTION", "").strip() or None
    if name is not None and name not in ATTENTION_BACKENDS:
        raise ValueError(f"SPECBENCH_ATTENTION={name!r} is not an attention backend; set it to one of "
                         f"{', '.join(sorted(ATTENTION_BACKENDS))} or unset it")
    return name


def _inv_freq(cfg: ModelConfig) -> Tensor:
    from specbench.models.decoder import rope_inv_freq

    return rope_inv_freq(cfg).float()


def init_random_(model: Transformer, seed: int) -> None:
    """Deterministic random weights (normal std 0.02; norms near 1) that give non-degenerate logits,
    drawn on the weights' device (so an 8B-parameter shape initialises in seconds on a GPU; the same
    seed gives other values there than on the CPU)."""
    device = model.embed.weight.device
    g = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g, device=device)
        if p.ndim == 1 and "norm" in name:
            vals = 1.0 + 0.1 * noise
        elif name.endswith("bias") or "embed" not in name:
            vals = 0.02 * noise
        else:
            vals = noise
        with torch.no_grad():
            p.copy_(vals.to(p.dtype))


def read_safetensors(paths: Iterable[Path]) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    out: dict[str, Tensor] = {}
    for p in paths:
        out.update(load_file(str(p)))
    return out


def load_hf_dir(path: str | Path) -> tuple[ModelConfig, dict[str, Tensor]]:
    """(config, native state dict) from a Hugging Face directory with config.json + safetensors."""
    d = Path(path)
    if not (d / "config.json").is_file():
        raise ModelLoadError(f"{str(d)!r} has no config.json: expected a Hugging Face model directory")
    raw = json.loads((d / "config.json").read_text())
    cfg = ModelConfig.from_hf(raw)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({d / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{str(d)!r} holds no .safetensors weights")
    return cfg, hf_to_native(cfg, read_safetensors(files))


GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (1, 2, 3)


def check_gguf_header(path: Path) -> None:
    """ModelLoadError unless `path` starts like a GGUF file: the magic, a known version, and plausible
    tensor and metadata counts (read before hashing or dequantizing it; 24 bytes, no parsing)."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {str(path)!r}: {exc.strerror}") from None
    if head[:4] != GGUF_MAGIC:
        raise ModelLoadError(f"{str(path)!r} is not a GGUF file (it starts with {head[:4]!r}, not {GGUF_MAGIC!r}); "
                             f"gguf:PATH needs a GGUF model file of a Llama, Qwen2 or Qwen3 model")
    if len(head) < 24:
        raise ModelLoadError(f"{str(path)!r} is a truncated GGUF file ({len(head)} bytes)")
    version, tensors, fields = struct.unpack("<IQQ", head[4:24])
    if version not in GGUF_VERSIONS or not (0 < tensors < 1 << 20) or fields >= 1 << 20:
        raise ModelLoadError(f"{str(path)!r} has a malformed GGUF header (version {version}, {tensors} tensors, "
                             f"{fields} metadata fields)")


def dequantize_gguf_to_cache(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF through transformers + gguf once and store a Hugging Face directory
    (config.json, model.safetensors, tokenizer files) in `out_dir`. It is written into a temporary
    folder beside `out_dir` and renamed into place only when complete: a failure leaves nothing."""
    import shutil
    import uuid

    check_gguf_header(gguf_path)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover
        raise ModelLoadError(f"reading GGUF needs transformers and gguf ({exc})") from exc
    log(f"dequantizing {gguf_path.name} once (about 20 s); cached in {out_dir}")
    made = [d for d in (out_dir.parent, *out_dir.parent.parents) if not d.exists()]  # deepest first
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")  # this process's own
    tmp.mkdir()  # (mkdir, not mkdtemp: the cached copy gets the umask's permissions, not 0700)
    try:
        kw = dict(gguf_file=gguf_path.name)
        try:
            tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kw)
            hf = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), dtype=torch.float32, **kw)
        except Exception as exc:  # transformers/gguf raise many types for a malformed or unsupported file
            raise ModelLoadError(f"cannot read the GGUF {str(gguf_path)!r}: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
        cfg = ModelConfig.from_hf(hf.config.to_dict())
        native = hf_to_native(cfg, hf.state_dict())
        save_hf_dir(cfg, native, tmp)
        tok.save_pretrained(str(tmp))
        gen = getattr(hf, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(str(tmp))
        if out_dir.exists() and not (out_dir / "config.json").is_file():
            shutil.rmtree(out_dir)  # an incomplete copy (left by a version that wrote in place)
        try:
            tmp.rename(out_dir)
        except OSError:  # another process finished the same copy first: keep theirs
            if not (out_dir / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        for d in made:  # folders this call created and left empty (a failure)
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()


def save_hf_dir(cfg: ModelConfig, native_sd: Mapping[str, Tensor], out_dir: Path) -> None:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    hf_sd = native_to_hf(cfg, {k: v.detach().cpu() for k, v in native_sd.items()})
    save_file(hf_sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))


def state_fingerprint(cfg: ModelConfig, sample: Mapping[str, Any]) -> str:
    """A short hash identifying a target (config + a few weight values rounded to bf16, so the same
    model loaded in bf16 on a GPU and in fp32 on a CPU has one fingerprint): heads record it so that
    loading a head on another target fails clearly."""
    h = hashlib.sha256(json.dumps(cfg.to_hf(), sort_keys=True).encode())
    for key in sorted(sample):
        t = sample[key]
        h.update(key.encode())
        h.update(t.detach().to(torch.bfloat16).float().cpu().flatten()[:4096].numpy().tobytes())
    return h.hexdigest()[:16]
