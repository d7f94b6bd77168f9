"""The tau table: tau at T = 0 of every shipped head beside ngram and self, at budgets 16, 64 and 256,
on the five benchmarks, by exact replay (fp32: one greedy reference per prompt, every configuration
replayed on it through the engine's reference mode; no decode-loop timings). The configurations and
datasets are experiments/head_table.py's, which times the same configurations in the real loop.

    specbench run experiments/tau_table.py --data-dir DATA_DIR                           # run / resume
    specbench run experiments/tau_table.py --data-dir DATA_DIR n=3 max_new_tokens=[64]   # a taste
    specbench table runs/tau_table --rows drafter,tree,budget --cols dataset --value tau

Other heads (snapshots, ablations): drafter_args={checkpoint:DIR} on the command line, or a study file
with one Grid per head directory. The multi-process GPU fill of this table (labelled head
directories, shards, a time budget) is scripts/tau_table.py.
"""

import dataclasses
from pathlib import Path

from specbench.bench import TableSpec
from specbench.bench.study import load_study

STUDY = dataclasses.replace(
    load_study(Path(__file__).with_name("head_table.py")),
    name="tau_table",
    replay=True,
    dtype="float32",
    table=TableSpec(rows=("drafter", "tree", "budget"), cols=("dataset",), values=("tau",)),
    description="tau of the shipped heads vs ngram and self at budgets 16/64/256 by exact replay (T = 0, fp32)",
)
