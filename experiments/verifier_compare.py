"""tau of every lossless verifier at T = 0.7 and T = 1 with the same drafts.

The verifier list is read from the registry (each class's `lossless` flag), so a new lossless
verifier joins the comparison by being registered. Verifiers that cannot serve a temperature
(e.g. `greedy` at T > 0) are skipped with a note. `self` drafts by sampling and records its draft
distribution (what rejection-sampling verifiers read); `ngram` drafts deterministically; a
trained tree drafter, when available, gives the tree verifiers real branching.

    specbench run experiments/verifier_compare.py --data-dir DATA_DIR
"""

from specbench.bench import DatasetSpec, Grid, Study, TableSpec
from specbench.verify import VERIFIERS

LOSSLESS = tuple(name for name in VERIFIERS.names() if VERIFIERS.get(name).lossless)
TEMPERATURES = (0.7, 1.0)

STUDY = Study(
    name="verifier_compare",
    grids=(Grid(drafters=("self", "ngram"), trees=("chain",), verifiers=LOSSLESS, budgets=(6,), temperatures=TEMPERATURES),
           Grid(drafters=("dflash",), trees=("ddtree",), verifiers=LOSSLESS, budgets=(16,), temperatures=TEMPERATURES,
                optional=True)),
    datasets=(DatasetSpec("gsm8k", n=20), DatasetSpec("mt_bench", n=20, args={"max_turns": 1})),
    max_new_tokens=(128,),
    table=TableSpec(rows=("drafter", "verifier", "temperature"), cols=("dataset",), values=("tau",)),
    description="tau of each lossless verifier at T = 0.7 and 1",
)
