"""Draft trees and tree policies. Pure package: tensors in, tensors out."""

from specbench.registry import Registry

TREE_POLICIES: Registry = Registry("tree policy")
TREE_POLICIES.register("chain", "specbench.trees.chain:ChainPolicy")

from specbench.trees.base import DepthScores, DraftTree, TreeError, TreePolicy  # noqa: E402

__all__ = ["TREE_POLICIES", "DepthScores", "DraftTree", "TreeError", "TreePolicy"]
