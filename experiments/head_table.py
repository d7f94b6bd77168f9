"""The trained-heads table (issue 5/6): tau and decode speed-up of every shipped head beside ngram and
self, at budgets 16, 64 and 256, greedy, on the five benchmarks.

    specbench run experiments/head_table.py --data-dir DATA_DIR --device cuda --dtype bfloat16
    specbench run experiments/head_table.py --data-dir DATA_DIR n=3 max_new_tokens=[128]   # a taste

tau alone on many prompts is cheaper through exact replay (scripts/tau_table.py, same configurations);
this study times the real decode loop, so its tau and tok/s come from the same requests.
"""

from specbench.bench import DatasetSpec, Grid, Study, TableSpec

BUDGETS = (16, 64, 256)

STUDY = Study(
    name="head_table",
    grids=(Grid(drafters=("dflash",), trees=("chain", "ddtree"), budgets=BUDGETS, optional=True),
           Grid(drafters=("jetspec",), trees=("accum-logp", "ddtree"), budgets=BUDGETS, optional=True),
           Grid(drafters=("jetspec-tree",), trees=("ddtree",), budgets=BUDGETS, optional=True),
           Grid(drafters=("eagle3",), trees=("eagle2",), budgets=BUDGETS, optional=True),
           Grid(drafters=("ngram",), trees=("ddtree",), budgets=BUDGETS),
           Grid(drafters=("self",), trees=("chain",), budgets=(4,))),
    datasets=(DatasetSpec("gsm8k", n=100), DatasetSpec("math500", n=100), DatasetSpec("mbpp", n=100),
              DatasetSpec("humaneval", n=100), DatasetSpec("mt_bench", n=80, args={"max_turns": 1})),
    max_new_tokens=(256,),
    warmup_tokens=48,  # one-time costs (graph capture, Triton JIT of the compaction kernel) stay out of the timings
    table=TableSpec(rows=("drafter", "tree", "budget"), cols=("dataset",), values=("tau", "decode_tok_s", "speedup_decode")),
    description="trained heads vs ngram and self: tau and decode speed-up at budgets 16/64/256 (T = 0)",
)
