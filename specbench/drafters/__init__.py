"""Drafters: propose draft trees for the target to verify."""

from specbench.registry import Registry

DRAFTERS: Registry = Registry("drafter")
DRAFTERS.register("ngram", "specbench.drafters.ngram:NgramDrafter")
DRAFTERS.register("self", "specbench.drafters.self_draft:SelfDrafter")

__all__ = ["DRAFTERS"]
