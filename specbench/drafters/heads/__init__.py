"""The DFlash-family draft heads: one backbone (fused target features injected as extra keys/values
into a few decoder layers of the target's own family, frozen target embedding + LM head) and the
drafters that run it: `dflash` (bidirectional block), `jetspec` (block-causal) and `jetspec-tree`
(block-causal pass + a path-conditioned tree-causal pass)."""
