"""Attention inside the draft block: bidirectional (dflash) vs block-causal (jetspec) vs
path-conditioned (jetspec-tree), each under its tree policies, at budgets 16, 64 and 256, T = 0.

    specbench run experiments/attention_ablation.py --data-dir DATA_DIR --device cuda --dtype bfloat16

All three heads are required: if one is not registered the study stops before loading anything,
naming the missing drafter.
"""

from specbench.bench import DatasetSpec, Grid, Study, TableSpec

BUDGETS = (16, 64, 256)

STUDY = Study(
    name="attention_ablation",
    grids=(Grid(drafters=("dflash",), trees=("chain", "ddtree"), budgets=BUDGETS),
           Grid(drafters=("jetspec",), trees=("accum-logp", "ddtree"), budgets=BUDGETS),
           Grid(drafters=("jetspec-tree",), trees=("accum-logp", "ddtree"), budgets=BUDGETS)),
    datasets=(DatasetSpec("gsm8k", n=100), DatasetSpec("math500", n=100), DatasetSpec("mbpp", n=100),
              DatasetSpec("humaneval", n=100), DatasetSpec("mt_bench", args={"max_turns": 1})),
    max_new_tokens=(256,),
    table=TableSpec(rows=("drafter", "tree", "budget"), cols=("dataset",), values=("tau",)),
    description="bidirectional vs block-causal vs path-conditioned draft heads (tau, T = 0)",
)
