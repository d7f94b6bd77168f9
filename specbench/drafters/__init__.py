"""Drafters: propose draft trees for the target to verify."""

from specbench.registry import Registry

DRAFTERS: Registry = Registry("drafter", base="specbench.drafters.base:Drafter")
DRAFTERS.register("ngram", "specbench.drafters.ngram:NgramDrafter")
DRAFTERS.register("self", "specbench.drafters.self_draft:SelfDrafter")
DRAFTERS.register("dflash", "specbench.drafters.heads.parallel:DFlashDrafter")
DRAFTERS.register("jetspec", "specbench.drafters.heads.parallel:JetSpecDrafter")
DRAFTERS.register("jetspec-tree", "specbench.drafters.heads.jetspec_tree:JetSpecTreeDrafter")
DRAFTERS.register("eagle3", "specbench.drafters.eagle3.drafter:Eagle3Drafter")

__all__ = ["DRAFTERS"]
