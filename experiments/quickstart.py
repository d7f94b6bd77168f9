"""Quickstart: AR decoding vs every shipped drafter on specbench's own arithmetic word problems,
with the default target (SmolLM2-135M-Instruct) on the CPU, greedy. A few minutes on two cores.

    specbench run experiments/quickstart.py            # prints tau and speed-up per drafter
    specbench run experiments/quickstart.py n=8 max_new_tokens=256
    specbench run experiments/quickstart.py --threads 1   # much faster when other jobs share the cores

A drafter is tried only if it is registered and builds (trained heads need their weights); the
others are skipped with a printed note. To add one, add a line to CANDIDATES.
"""

from specbench.bench import DatasetSpec, Grid, Study, TableSpec

# drafter -> (tree policy, budget) sized for a CPU
CANDIDATES = {
    "ngram": ("chain", 8),
    "self": ("chain", 4),
    "dflash": ("ddtree", 16),
    "jetspec": ("accum-logp", 16),
    "jetspec-tree": ("accum-logp", 16),
    "eagle3": ("eagle2", 16),
}
SHIPPED_WITH_CODE = ("ngram", "self")  # need no weights: a failure there is a bug, not a missing head

STUDY = Study(
    name="quickstart",
    grids=tuple(Grid(drafters=(drafter,), trees=(tree,), budgets=(budget,), optional=drafter not in SHIPPED_WITH_CODE)
                for drafter, (tree, budget) in CANDIDATES.items()),
    datasets=(DatasetSpec("builtin", n=4),),
    max_new_tokens=(96,),
    table=TableSpec(rows=("drafter", "tree", "budget"), cols=(),
                    values=("tau", "speedup_decode", "speedup_e2e", "decode_tok_s")),
    description="AR vs every available drafter, default target, CPU, greedy",
)
