"""The verifier table (issue 3's closing note): mean tau of every registered verifier on the first 20
GSM8K test questions (chat template), T = 1, drafter `self` under `chain`, budget 8, 128 new tokens.
Lossy verifiers run too (allow_lossy), in a grid of their own; `greedy` needs T = 0 and is skipped with
a note.

    specbench run experiments/verifier_table.py --data-dir DATA_DIR
    specbench table runs/verifier_table --rows drafter,verifier --cols '' --value tau,rounds

Whether each verifier is lossless is proven, not measured here: the exact-enumeration proofs and the
Monte-Carlo agreement run over every registered verifier in the test suite
(`python -m pytest tests/verify/test_verify_exact.py tests/verify/test_verify_montecarlo.py -v`).
"""

from specbench.bench import DatasetSpec, Grid, Study, TableSpec
from specbench.verify import VERIFIERS

LOSSLESS = tuple(n for n in VERIFIERS.names() if VERIFIERS.get(n).lossless)
LOSSY = tuple(n for n in VERIFIERS.names() if not VERIFIERS.get(n).lossless)

STUDY = Study(
    name="verifier_table",
    grids=(Grid(drafters=("self",), trees=("chain",), verifiers=LOSSLESS, budgets=(8,), temperatures=(1.0,)),
           *((Grid(drafters=("self",), trees=("chain",), verifiers=LOSSY, budgets=(8,), temperatures=(1.0,),
                   allow_lossy=True),) if LOSSY else ())),
    datasets=(DatasetSpec("gsm8k", n=20),),
    max_new_tokens=(128,),
    table=TableSpec(rows=("drafter", "verifier"), cols=(), values=("tau", "speedup_decode")),
    description="tau of every registered verifier at T = 1 (self drafter, chain, budget 8) on GSM8K",
)
