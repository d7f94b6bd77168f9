"""Drafters: propose the draft tree the target verifies each round.

Contract (`drafters.base.Drafter`): built as `Drafter(target, **drafter_args)`; `draft(state, policy,
budget)` returns a DraftTree whose root is the anchor with at most `budget` further nodes, asking the
policy for the shape (`build` with per-depth scores, `grow` with an expand callback, or `select` on
its own scored candidates); `begin` and `observe` see the prefill and each verify forward, with the
tapped target layers. Every drafter declares `policies`, `taps` and `weights` (no defaults: leaving
one out fails when the class is defined), and one that needs weights also builds with
`random_init=True`. Greedy identity with AR decoding is tested for every registered drafter under
each policy it declares (tests/spine/test_lossless_greedy.py).

Imports: models/ (the target, its decoder pieces and caches), trees/, verify/ (sampling transforms,
Randomness), kernels/, registry and config; never the engine, bench or cli.

Registered: ngram (prompt lookup), self (the target's first layers), dflash, jetspec, jetspec-tree
(the DFlash-family heads, drafters/heads/), eagle3 (drafters/eagle3/). Methods: docs/methods.md.
"""

from specbench.registry import Registry

DRAFTERS: Registry = Registry("drafter", base="specbench.drafters.base:Drafter")
DRAFTERS.register("ngram", "specbench.drafters.ngram:NgramDrafter")
DRAFTERS.register("self", "specbench.drafters.self_draft:SelfDrafter")
DRAFTERS.register("dflash", "specbench.drafters.heads.parallel:DFlashDrafter")
DRAFTERS.register("jetspec", "specbench.drafters.heads.parallel:JetSpecDrafter")
DRAFTERS.register("jetspec-tree", "specbench.drafters.heads.jetspec_tree:JetSpecTreeDrafter")
DRAFTERS.register("eagle3", "specbench.drafters.eagle3.drafter:Eagle3Drafter")
DRAFTERS.register("jetspec++", "specbench.drafters.jetspecpp.drafter:JetSpecPPDrafter")

__all__ = ["DRAFTERS"]
