"""tau and speed-up against the budget (16 ... 256 draft nodes) for each drafter and tree policy, greedy.

    specbench run experiments/budget_sweep.py --data-dir DATA_DIR --device cuda --dtype bfloat16
    specbench run experiments/budget_sweep.py --data-dir DATA_DIR n=5 budgets=[16,64]   # a CPU taste

Trained heads are optional: a head that is not registered or has no weights yet is skipped with a note.
"""

from specbench.bench import DatasetSpec, Grid, Study, TableSpec

BUDGETS = (16, 32, 64, 128, 256)
# drafter -> tree policies to sweep (policies a drafter does not support are skipped with a note)
HEADS = {
    "dflash": ("chain", "ddtree"),
    "jetspec": ("accum-logp", "ddtree"),
    "jetspec-tree": ("accum-logp", "ddtree"),
    "eagle3": ("chain", "eagle2"),
}

STUDY = Study(
    name="budget_sweep",
    grids=(Grid(drafters=("ngram",), trees=("chain",), budgets=BUDGETS),
           *(Grid(drafters=(drafter,), trees=trees, budgets=BUDGETS, optional=True) for drafter, trees in HEADS.items())),
    datasets=(DatasetSpec("gsm8k", n=30), DatasetSpec("humaneval", n=30), DatasetSpec("mt_bench", n=30, args={"max_turns": 1})),
    max_new_tokens=(256,),
    table=TableSpec(rows=("drafter", "tree", "budget"), cols=("dataset",), values=("tau", "speedup_decode")),
    description="tau and decode speed-up vs budget per drafter and tree policy (T = 0)",
)
