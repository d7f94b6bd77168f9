"""The registered components, as the registry-driven suites see them (read at collection time).

Each list is computed from the registries and the components' own declarations, never kept by
hand: a component registered in specbench, or in a module passed with `--components MODULE`
(tests/conftest.py), joins every suite that applies to it.
"""

from __future__ import annotations

from typing import Any

from specbench.config import SamplingConfig
from specbench.drafters import DRAFTERS
from specbench.trees import TREE_POLICIES
from specbench.verify import VERIFIERS


def verifiers(lossless: bool) -> list[str]:
    """Registered verifiers that declare `lossless` equal to the argument."""
    return [n for n in VERIFIERS.names() if VERIFIERS.get(n).lossless is lossless]


def serves_sampling(name: str) -> bool:
    """The verifier accepts T > 0 (its `check` does not refuse it); otherwise it serves T = 0 only."""
    try:
        VERIFIERS.build(name).check(SamplingConfig(temperature=1.0))
    except ValueError:
        return False
    return True


def policy_cases(growing: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """(policy, args) for every registered tree policy (only those with can_grow if `growing`) and
    every argument set in its `examples`."""
    return [(n, dict(args)) for n in TREE_POLICIES.names() if not growing or TREE_POLICIES.get(n).can_grow
            for args in TREE_POLICIES.get(n).examples]


def drafter_cases(trained: bool | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(drafter, policy, policy args) for every registered drafter and each policy it works with (the
    policy's first example). trained: only drafters that need (True) or do not need (False) weights."""
    out = []
    for name in DRAFTERS.names():
        cls = DRAFTERS.get(name)
        if trained is not None and (cls.weights is not None) != trained:
            continue
        out += [(name, policy, dict(TREE_POLICIES.get(policy).examples[0])) for policy in cls.policy_names()]
    return out


def case_id(*parts: Any) -> str:
    return "-".join(str(p) if not isinstance(p, dict) or p else "" for p in parts).strip("-").replace(" ", "")
