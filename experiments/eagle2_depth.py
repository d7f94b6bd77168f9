"""tau of eagle3/eagle2 at budget 64 against the tree's depth, by exact replay (T = 0, fp32): what each expanded
depth (one head pass a round, `experiments/draft_cost.py` times it) buys in accepted tokens.

    specbench run experiments/eagle2_depth.py --data-dir DATA_DIR                  # CPU, fp32; resumable
    specbench table runs/eagle2_depth --rows tree_args --cols dataset --value tau

EAGLE-2's default is depth 7 (`max_depth=8` expanded frontiers here) with top_k 10; the round table's eagle3 row
spends ~0.9 ms of a ~2.2 ms round drafting on the H200 (8 passes), so a shallower tree that keeps tau is faster.
"""

from specbench.bench import DatasetSpec, Grid, Study, TableSpec

DEPTHS = (3, 4, 5, 6, 7, 8)

STUDY = Study(
    name="eagle2_depth",
    grids=tuple(Grid(drafters=("eagle3",), trees=("eagle2",), budgets=(64,), tree_args={"top_k": 10, "max_depth": d},
                     optional=True) for d in DEPTHS),
    datasets=(DatasetSpec("gsm8k", n=10), DatasetSpec("math500", n=10)),
    max_new_tokens=(256,),
    replay=True,
    dtype="float32",
    table=TableSpec(rows=("tree_args",), cols=("dataset",), values=("tau",)),
    description="eagle3/eagle2/64: tau against the tree's depth (exact replay)",
)
