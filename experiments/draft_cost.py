"""Drafting cost per round against depth: eagle3 (one head pass per depth) beside jetspec (one pass over
a block of depth + 1 whatever the depth), in the real decode loop, greedy.

    specbench run experiments/draft_cost.py --data-dir DATA_DIR                              # CPU, fp32
    specbench run experiments/draft_cost.py --data-dir DATA_DIR --device cuda --dtype bfloat16
    specbench table runs/draft_cost --rows drafter,tree,budget,drafter_args,tree_args --cols '' \\
        --value draft_ms,tree_ms,verify_forward_ms,tau

Series, for depth d = 1 .. 15: eagle3/chain at budget d (d passes), eagle3/eagle2 with top_k 10 and
max_depth d <= 11 at budget 64 (d passes, each over up to 10 frontier nodes), jetspec/chain with block_size
d + 1 at budget d (one pass). `draft_ms` is the engine's "draft" stage per round (head passes and the
context feed of the newly committed tokens; on CUDA from events), `verify_forward_ms` the same round's
target forward for scale. The shipped heads are used (their weights change how many tokens each round
feeds, not the cost of a pass); depth is capped by jetspec's trained block of 16.
"""

from specbench.bench import DatasetSpec, Grid, Study, TableSpec

DEPTHS = tuple(range(1, 16))
EAGLE2_DEPTHS = DEPTHS[:11]  # top_k 10 offers 10 + 100 (d - 1) candidates: eagle3's 1024-row tree buffer caps d at 11

STUDY = Study(
    name="draft_cost",
    grids=(Grid(drafters=("eagle3",), trees=("chain",), budgets=DEPTHS, optional=True),
           *(Grid(drafters=("eagle3",), trees=("eagle2",), budgets=(64,), tree_args={"top_k": 10, "max_depth": d},
                  optional=True) for d in EAGLE2_DEPTHS),
           *(Grid(drafters=("jetspec",), trees=("chain",), budgets=(d,), drafter_args=({"block_size": d + 1},),
                  optional=True) for d in DEPTHS)),
    datasets=(DatasetSpec("gsm8k", n=3),),
    max_new_tokens=(128,),
    table=TableSpec(rows=("drafter", "tree", "budget", "drafter_args", "tree_args"), cols=(),
                    values=("draft_ms", "verify_forward_ms", "tau")),
    description="draft stage ms per round vs depth: eagle3 (a pass per depth) vs jetspec (one block pass)",
)
