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


def drafter_cases() -> list[tuple[str, str, dict[str, Any]]]:
    """(drafter, policy, policy args) for every registered drafter and each policy it works with (the
    policy's first example)."""
    return [(name, policy, dict(TREE_POLICIES.get(policy).examples[0]))
            for name in DRAFTERS.names() for policy in DRAFTERS.get(name).policy_names()]
