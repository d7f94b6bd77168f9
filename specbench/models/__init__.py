"""Target models: the native Llama/Qwen2/Qwen3 decoder, its static KV cache, loaders and model zoo."""

from specbench.registry import Registry

TARGETS: Registry = Registry("target")

from specbench.models.config import PRESETS, ModelConfig  # noqa: E402
from specbench.models.decoder import ForwardOutput, KVCache, Transformer  # noqa: E402
from specbench.models.target import PromptError, TargetModel, default_target_name, load_target  # noqa: E402

__all__ = ["TARGETS", "PRESETS", "ModelConfig", "ForwardOutput", "KVCache", "Transformer", "TargetModel",
           "PromptError", "default_target_name", "load_target"]
