"""Frozen configuration dataclasses and `key=value` overrides (values parsed with YAML rules).

A run is fully described by a `RunConfig`; its `to_dict()` is stored with every result so a table row
can always be traced back to exactly what produced it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TypeVar

import yaml

C = TypeVar("C")


class ConfigError(ValueError):
    """A configuration value is invalid; the message says which and what to do.

    `keys` are the configuration keys the message names, each written in it as a word of its own,
    bare or as `key=VALUE` ("raise max_seq_len", "set allow_lossy=True"), so that a front end whose
    users spell them otherwise (the CLI's flags) can say them its own way with `spelled`.
    """

    def __init__(self, message: str, *, keys: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.keys = tuple(keys)

    def spelled(self, flag_of: Callable[[str], str | None]) -> str:
        """The message with each key that `flag_of` spells (e.g. max_seq_len -> "--max-seq-len") rewritten:
        `key` -> flag, `key=True` -> flag (a switch), `key=VALUE` -> "flag VALUE"."""
        text = str(self)
        for key in self.keys:
            flag = flag_of(key)
            if flag is None:
                continue
            text = re.sub(rf"(?<![\w.-]){re.escape(key)}(?:=([^\s,;()]+))?(?![\w-])",
                          lambda m: flag if m.group(1) in (None, "True") else f"{flag} {m.group(1)}", text)
        return text


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
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}",
                              keys=("temperature",))
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}", keys=("top_k",))
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}", keys=("top_p",))

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
        if not isinstance(self.budget, int) or isinstance(self.budget, bool) or self.budget < 1:
            raise ConfigError(f"budget counts draft nodes (root excluded) and must be an integer >= 1, got "
                              f"{self.budget!r}", keys=("budget",))


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
    attention: str = "auto"  # triton on CUDA, sdpa elsewhere

    def __post_init__(self) -> None:
        for key in ("max_new_tokens", "max_seq_len"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{key} must be an integer >= 1, got {value!r}", keys=(key,))
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}", keys=("dtype",))
        # The shortest prompt (1 token), every new token and one verify pass of 1 + budget nodes must fit the
        # cache: checked here, before any model loads (the prompt's own length is checked per request).
        budget = self.spec.budget if self.spec.drafter is not None else 0
        need = 1 + self.max_new_tokens + budget + 1
        if need > self.max_seq_len:
            with_budget, or_budget = (f" with budget={budget}", " or budget") if budget else ("", "")
            raise ConfigError(
                f"max_new_tokens={self.max_new_tokens}{with_budget} needs a KV cache of at least {need} tokens (for a "
                f"one-token prompt), more than max_seq_len={self.max_seq_len}: lower max_new_tokens{or_budget}, or "
                f"raise max_seq_len", keys=("max_new_tokens", "budget", "max_seq_len"))

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
