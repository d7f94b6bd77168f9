"""jetspec++'s device round with foresight through the fused layer ops (Triton; the interpreter on the CPU):
the batched foresight passes (the flat rows' head passes, fused context K/V, `cached_layers`) and the decoder
slice draft the same trees and the same candidate trees ahead as with the reference ops and emit AR's
tokens (fp32). Slow on the CPU (~45 s a
policy under the interpreter)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.config import SpecConfig  # noqa: E402
from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter  # noqa: E402
from specbench.engine import SpecDecoder, ar_decoder  # noqa: E402
from specbench.models import load_target  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("tree, budget", [("chain", 5), ("ddtree-vec", 8)])
def test_fused_foresight_round_equals_the_reference_round(device, tree: str, budget: int) -> None:
    target = load_target("random:tiny-llama", device=device, dtype="float32")
    prompt = list(range(5, 17))
    ar = ar_decoder(target, max_seq_len=96).generate(prompt, 12).tokens
    runs = []
    for level in ("reference", "elementwise"):
        target.model.set_fused(level)
        try:
            drafter = JetSpecPPDrafter(target, random_init=True, J=1, R=1, foresight="on", B=4, pipeline="sequential")
            dec = SpecDecoder(target, SpecConfig(drafter="jetspec++", tree=tree, budget=budget), max_seq_len=96,
                              drafter=drafter)
            assert dec.branching
            trees: list[list[int]] = []
            res = dec.generate(prompt, 12, on_round=lambda i, t, r: trees.append(t.tokens.tolist() + t.parents.tolist()))
        finally:
            target.model.set_fused("reference")
        assert res.tokens == ar, level
        fs = drafter.device_foresight
        assert fs is not None
        runs.append((trees, fs.cand["tokens"].tolist(), fs.cand["parents"].tolist()))  # the last stage's B candidates
    assert runs[0][0] == runs[1][0], "the fused round drafted other trees than the reference round"
    assert runs[0][1:] == runs[1][1:], "the fused foresight stage drafted other candidate trees"
