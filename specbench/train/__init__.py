"""Draft-head training on a frozen target: regenerated responses, one shared target forward per batch,
several heads trained together (`OBJECTIVES`: name -> HeadObjective subclass)."""

from specbench.registry import Registry

OBJECTIVES: Registry = Registry("training objective")
OBJECTIVES.register("dflash", "specbench.train.block_objective:DFlashObjective")
OBJECTIVES.register("jetspec", "specbench.train.block_objective:JetSpecObjective")
OBJECTIVES.register("jetspec-tree", "specbench.train.block_objective:JetSpecTreeObjective")
OBJECTIVES.register("eagle3", "specbench.train.eagle3_objective:Eagle3Objective")
OBJECTIVES.register("jetspec++", "specbench.train.jetspecpp_objective:JetSpecPPObjective")

__all__ = ["OBJECTIVES"]
