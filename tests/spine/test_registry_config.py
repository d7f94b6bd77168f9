from __future__ import annotations

import pytest

from specbench.config import ConfigError, RunConfig, SamplingConfig, SpecConfig, apply_overrides, from_dict
from specbench.registry import Registry, RegistryError


class Plugin:
    pass


def test_decorator_lazy_and_dotted_path() -> None:
    reg: Registry = Registry("widget")

    @reg.register("a")
    class A:
        pass

    reg.register("lazy", "collections:OrderedDict")
    assert reg.get("a") is A
    from collections import OrderedDict

    assert reg.get("lazy") is OrderedDict
    assert reg.get(f"{__name__}:Plugin") is Plugin  # out-of-tree class by dotted path
    assert reg.get(f"{__name__}.Plugin") is Plugin
    assert reg.names() == ["a", "lazy"]


def test_duplicate_and_unknown_names_are_errors() -> None:
    reg: Registry = Registry("widget")
    reg.register("x", int)
    with pytest.raises(RegistryError, match="registered twice"):
        reg.register("x", float)
    with pytest.raises(RegistryError, match="unknown widget 'y'.*Registered widgets: x"):
        reg.get("y")
    with pytest.raises(RegistryError, match="neither registered nor importable"):
        reg.get("no_such_pkg.mod:Thing")


def test_lazy_entry_resolved_by_its_own_decorator_is_not_a_duplicate() -> None:
    from specbench.drafters import DRAFTERS
    from specbench.drafters.ngram import NgramDrafter

    assert DRAFTERS.get("ngram") is NgramDrafter


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
    ],
)
def test_sampling_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SamplingConfig(**kwargs)


def test_budget_validation_and_ar_alias() -> None:
    with pytest.raises(ConfigError, match="budget"):
        SpecConfig(budget=0)
    assert SpecConfig(drafter="ar").drafter is None


def test_overrides_build_nested_config() -> None:
    base = RunConfig().to_dict()
    data = apply_overrides(base, ["spec.budget=16", "sampling.temperature=0.7", "spec.drafter=ngram"])
    cfg = from_dict(RunConfig, data)
    assert cfg.spec.budget == 16 and cfg.sampling.temperature == 0.7 and cfg.spec.drafter == "ngram"
    with pytest.raises(ConfigError, match="unknown SpecConfig key"):
        from_dict(RunConfig, apply_overrides(base, ["spec.bugdet=3"]))
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(base, ["spec.budget"])
