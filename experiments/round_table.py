"""The GPU round table (issue 13): where a round's time goes for every drafter, beside AR, on the same
stack in the same run: ms per round by stage, tau, decode tok/s and speed-up, greedy, bf16.

    specbench run experiments/round_table.py --data-dir DATA --device cuda --dtype bfloat16
    specbench table runs/round_table/results.jsonl --rows drafter,drafter_args,tree,budget,tree_args --cols dataset \\
        --value tau,decode_tok_s,speedup_decode,draft_ms,tree_ms,verify_forward_ms,verify_ms,commit_ms,round_ms

Stage times are CUDA events between the round's graph replays (no device sync per stage); `round_ms`
is their sum, `overhead_frac` the share of drafting + tree + verify + commit in it.
"""

from specbench.bench import DatasetSpec, Grid, Study, TableSpec

STUDY = Study(
    name="round_table",
    grids=(Grid(drafters=("dflash", "jetspec", "jetspec-tree"), trees=("ddtree",), budgets=(64,), optional=True),
           # the same heads drafting blocks of 8 beside their trained 16: what the shorter block saves a round, the
           # other side of its trade (docs/training_at_scale.md, "Block size")
           Grid(drafters=("dflash", "jetspec", "jetspec-tree"), trees=("ddtree",), budgets=(64,),
                drafter_args=({"block_size": 8},), optional=True),
           Grid(drafters=("dflash",), trees=("chain",), budgets=(16,), optional=True),
           Grid(drafters=("eagle3",), trees=("eagle2",), budgets=(64,), optional=True),
           *(Grid(drafters=("eagle3",), trees=("eagle2",), budgets=(64,), tree_args={"top_k": 10, "max_depth": d},
                  optional=True) for d in (5, 6)),  # fewer head passes: experiments/eagle2_depth.py's tau
           Grid(drafters=("ngram",), trees=("ddtree",), budgets=(16, 64)),
           Grid(drafters=("self",), trees=("chain",), budgets=(4,))),
    # items 1-10 (the tables before 2026-12-07: items 1-5, still a subset row by row): by exact replay (fp32) they sit
    # nearer the 100-item means, e.g. dflash/ddtree/64 on MATH-500 2.44 against 2.33 for items 1-5 and 2.60 for all
    # 100; ngram's MATH-500 mean comes from a few items that repeat long spans (items 1-10 1.97, all 100 2.74 at b16)
    datasets=(DatasetSpec("gsm8k", n=10), DatasetSpec("math500", n=10)),
    max_new_tokens=(256,),
    device="cuda",
    dtype="bfloat16",
    warmup_tokens=48,  # graph capture and Triton JIT happen here, outside the timings
    timing_repeats=3,  # each prompt decoded three times, the median kept: one host stall moves no row
    table=TableSpec(rows=("drafter", "drafter_args", "tree", "budget", "tree_args"), cols=("dataset",),
                    values=("tau", "decode_tok_s", "speedup_decode", "round_ms", "overhead_frac")),
    description="per-stage round times, tau and speed-up of every drafter against AR on the GPU (T = 0)",
)
