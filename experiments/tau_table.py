"""The tau table: tau at T = 0 of every shipped head beside ngram and self, at budgets 16, 64 and 256,
on the five benchmarks, by exact replay (fp32: one greedy reference per prompt, every configuration
replayed on it through the engine's reference mode; no decode-loop timings).

    specbench run experiments/tau_table.py --data-dir DATA_DIR                      # run / resume
    specbench run experiments/tau_table.py --data-dir DATA_DIR n=3 max_new_tokens=[64]   # a taste
    specbench table runs/tau_table --rows drafter,tree,budget --cols dataset --value tau

Other heads (snapshots, ablations): drafter_args={checkpoint:DIR} on the command line, or a copy of
this file with one Grid per head directory. The same configurations timed in the real decode loop:
experiments/head_table.py. The multi-process GPU fill of this table (labelled head directories,
shards, a time budget) is scripts/tau_table.py.
"""

from specbench.bench import DatasetSpec, Grid, Study, TableSpec

BUDGETS = (16, 64, 256)

STUDY = Study(
    name="tau_table",
    grids=(Grid(drafters=("dflash",), trees=("chain", "ddtree"), budgets=BUDGETS, optional=True),
           Grid(drafters=("jetspec",), trees=("accum-logp", "ddtree"), budgets=BUDGETS, optional=True),
           Grid(drafters=("jetspec-tree",), trees=("ddtree",), budgets=BUDGETS, optional=True),
           Grid(drafters=("eagle3",), trees=("eagle2",), budgets=BUDGETS, optional=True),
           Grid(drafters=("ngram",), trees=("ddtree",), budgets=BUDGETS),
           Grid(drafters=("self",), trees=("chain",), budgets=(4,))),
    datasets=(DatasetSpec("gsm8k", n=100), DatasetSpec("math500", n=100), DatasetSpec("mbpp", n=100),
              DatasetSpec("humaneval", n=100), DatasetSpec("mt_bench", n=80, args={"max_turns": 1})),
    max_new_tokens=(256,),
    replay=True,
    table=TableSpec(rows=("drafter", "tree", "budget"), cols=("dataset",), values=("tau",)),
    description="tau of the shipped heads vs ngram and self at budgets 16/64/256 by exact replay (T = 0, fp32)",
)
