"""Frozen configuration dataclasses and `key=value` overrides (values parsed with YAML rules).

A run is fully described by a `RunConfig`; its `to_dict()` is stored with every result so a table row
can always be traced back to exactly what produced it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

import yaml

C = TypeVar("C")


class ConfigError(ValueError):
    """A configuration value is invalid; the message says which and what to do."""


@dataclass(frozen=True)
class SamplingConfig:
    """How the target's next-token law is processed before sampling (and before verification).

    temperature == 0 means greedy decoding. top_k == 0 and top_p == 1.0 disable those filters.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SpecConfig:
    """Which speculative-decoding components to use, by registry name.

    drafter None (or "none"/"ar") means plain autoregressive decoding through the same loop.
    budget = number of draft nodes excluding the root (docs/DESIGN.md, "Conventions").
    """

    drafter: str | None = None
    tree: str = "chain"
    verifier: str = "greedy"
    budget: int = 8
    drafter_args: Mapping[str, Any] = field(default_factory=dict)
    tree_args: Mapping[str, Any] = field(default_factory=dict)
    verifier_args: Mapping[str, Any] = field(default_factory=dict)
    allow_lossy: bool = False

    def __post_init__(self) -> None:
        if self.drafter in ("none", "ar", ""):
            object.__setattr__(self, "drafter", None)
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ConfigError(f"budget (draft nodes, root excluded) must be an integer >= 1, got {self.budget!r}")


@dataclass(frozen=True)
class RunConfig:
    """One generation setting: target + components + sampling + lengths + device."""

    target: str = "smollm2-135m"
    spec: SpecConfig = field(default_factory=SpecConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_new_tokens: int = 128
    max_seq_len: int = 2048
    device: str = "cpu"
    dtype: str = "float32"
    attention: str = "sdpa"

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
    """Build a (nested) frozen dataclass from a mapping; unknown keys are an error naming the valid ones."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} key(s) {sorted(unknown)}; valid keys: {sorted(fields)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        sub = _NESTED.get((cls.__name__, name))
        kwargs[name] = from_dict(sub, value) if sub is not None and isinstance(value, Mapping) else value
    return cls(**kwargs)  # type: ignore[call-arg]


_NESTED: dict[tuple[str, str], type] = {("RunConfig", "spec"): SpecConfig, ("RunConfig", "sampling"): SamplingConfig}


def parse_value(text: str) -> Any:
    """Parse a CLI override value with YAML rules ("8" -> 8, "0.7" -> 0.7, "null" -> None, "[1,2]" -> list)."""
    return yaml.safe_load(text)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides to a nested dict (copied)."""
    out = _deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. spec.budget=16)")
        key, _, raw = item.partition("=")
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = nxt
        node[parts[-1]] = parse_value(raw)
    return out


def _deepcopy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d
