"""Quickstart: AR decoding against every shipped drafter, with the default target (SmolLM2-135M-Instruct)
in fp32 on the CPU, greedy, on three of specbench's own arithmetic word problems (48 new tokens each).
About 2 minutes on two shared cores (the 21 generations took 96-118 s at load average 1-3.5); the
first run adds the model's one-time fetch and dequantization.

    specbench run experiments/quickstart.py              # prints tau and speed-up per drafter
    specbench run experiments/quickstart.py n=8 max_new_tokens=[256]   # more prompts, longer answers

What it measures, per prompt and drafter, against AR on the same prompt in the same run: tau (tokens
per verify pass, bonus included) and the decode-time speed-up (prefill excluded; speedup_e2e includes
it). Greedy SD emits exactly AR's tokens, so only the time differs. On a CPU the speed-ups are not the
GPU's: here a verify pass over 1 + 16 tokens costs 2.4 AR steps and a head's draft 0.65-1.3 more
(on an H200, where a small model's AR step is launch-bound, a 64-node verify costs 1.2-1.8 AR steps),
so a drafter needs a high tau just to break even, and the shipped drafters measure at or below AR.
Three short prompts are a taste, not a benchmark: `experiments/head_table.py` and
`experiments/budget_sweep.py` run the benchmarks.

A drafter is tried only if it is registered and builds (trained heads need their weights); the
others are skipped with a printed note. To add one, add a line to CANDIDATES.
"""

from specbench.bench import DatasetSpec, Grid, Study, TableSpec

# drafter -> (tree policy, budget) sized for a CPU
CANDIDATES = {
    "ngram": ("chain", 8),
    "self": ("chain", 2),
    "dflash": ("ddtree", 16),
    "jetspec": ("accum-logp", 16),
    "jetspec-tree": ("accum-logp", 16),
    "eagle3": ("eagle2", 16),
    "jetspec++": ("chain", 16),  # the paper's setting; J = 1 refinement pass, R = 1 context refresh (its defaults)
}
SHIPPED_WITH_CODE = ("ngram", "self")  # need no weights: a failure there is a bug, not a missing head

STUDY = Study(
    name="quickstart",
    grids=tuple(Grid(drafters=(drafter,), trees=(tree,), budgets=(budget,), optional=drafter not in SHIPPED_WITH_CODE)
                for drafter, (tree, budget) in CANDIDATES.items()),
    datasets=(DatasetSpec("builtin", n=3),),
    max_new_tokens=(48,),
    table=TableSpec(rows=("drafter", "tree", "budget"), cols=(),
                    values=("tau", "speedup_decode", "speedup_e2e", "decode_tok_s")),
    description="AR vs every available drafter, default target, CPU, greedy",
)
