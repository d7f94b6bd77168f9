"""`ModelConfig`: the shape of a Llama / Qwen2 / Qwen3 decoder, read from a Hugging Face config."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

FAMILIES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None  # {"rope_type": "llama3"|"linear", ...}; None = default
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"model family {self.family!r} is not supported; supported: {', '.join(FAMILIES)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "ModelConfig":
        """From a Hugging Face config.json dict (model_type llama, qwen2 or qwen3)."""
        family = cfg.get("model_type", "")
        if family not in FAMILIES:
            raise ValueError(
                f"model_type {family!r} is not supported by the native decoder; supported: {', '.join(FAMILIES)}"
            )
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        rope_params = dict(cfg.get("rope_parameters") or {})
        rope_scaling = dict(cfg.get("rope_scaling") or {}) or None
        theta = cfg.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        rope_type = rope_params.get("rope_type", "default")
        if rope_scaling is None and rope_type not in (None, "default"):
            rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if rope_scaling is not None and rope_scaling.get("rope_type", rope_scaling.get("type")) in (None, "default"):
            rope_scaling = None
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
        return cls(
            family=family,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    def to_hf(self) -> dict[str, Any]:
        """A Hugging Face config dict (used to build transformers' reference model and to save)."""
        out: dict[str, Any] = {
            "model_type": self.family,
            "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[self.family]],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
        }
        if self.rope_scaling:
            out["rope_scaling"] = dict(self.rope_scaling)
        if self.family == "llama":
            out["attention_bias"] = self.qkv_bias
            out["mlp_bias"] = False
        if self.bos_token_id is not None:
            out["bos_token_id"] = self.bos_token_id
        if self.eos_token_ids:
            out["eos_token_id"] = list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else self.eos_token_ids[0]
        return out

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


# Shapes used by tests and GPU timing (random weights).
PRESETS: dict[str, ModelConfig] = {
    "tiny-llama": ModelConfig("llama", 96, 64, 128, 2, 4, 2, 16, rms_norm_eps=1e-5, max_position_embeddings=512),
    "tiny-qwen2": ModelConfig("qwen2", 96, 64, 128, 2, 4, 2, 16, qkv_bias=True, max_position_embeddings=512),
    "tiny-qwen3": ModelConfig("qwen3", 96, 64, 128, 2, 4, 2, 32, qk_norm=True, tie_word_embeddings=True, max_position_embeddings=512),
    "smollm2-135m-shape": ModelConfig(
        "llama", 49152, 576, 1536, 30, 9, 3, 64, rms_norm_eps=1e-5, rope_theta=100000.0,
        max_position_embeddings=8192, tie_word_embeddings=True,
    ),
    "qwen3-8b-shape": ModelConfig(
        "qwen3", 151936, 4096, 12288, 36, 32, 8, 128, rope_theta=1000000.0, qk_norm=True,
        max_position_embeddings=40960,
    ),
}
