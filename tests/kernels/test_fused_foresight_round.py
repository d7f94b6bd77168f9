"""jetspec++'s device round with foresight through the fused layer ops (Triton; the interpreter on the CPU):
the batched foresight passes (the flat rows' head passes, fused context K/V, `cached_layers`) and the decoder
slice draft the same trees and the same candidate trees ahead as with the reference ops and emit AR's
tokens (fp32); the same with the flat rows and the decoder slice on the tree-attention kernel instead of
SDPA. Slow on the CPU (~45 s a policy under the interpreter)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="the kernel tests need Triton (CUDA, or TRITON_INTERPRET=1 on the CPU)")

from specbench.engine import ar_decoder  # noqa: E402
from specbench.models import load_target  # noqa: E402

from kernel_cases import foresight_round  # noqa: E402


KNOBS = {  # what is switched: (the model's setter, the two settings compared, the setting restored after:
    # None = the model's own before the test)
    "fused level": ("set_fused", ("reference", "elementwise"), "reference"),
    "attention backend": ("set_attention", ("sdpa", "triton"), None),  # flat rows on the tree-attention kernel
}


@pytest.mark.slow
@pytest.mark.parametrize("knob", list(KNOBS))
@pytest.mark.parametrize("tree, budget", [("chain", 5), ("ddtree-vec", 8)])
def test_foresight_round_is_the_same_under_either_setting(device, knob: str, tree: str, budget: int) -> None:
    target = load_target("random:tiny-llama", device=device, dtype="float32")
    prompt = list(range(5, 17))
    ar = ar_decoder(target, max_seq_len=96).generate(prompt, 12).tokens
    setter, settings, restore = KNOBS[knob]
    restore = target.model.attention if restore is None else restore
    runs = []
    for value in settings:
        getattr(target.model, setter)(value)
        try:
            runs.append(foresight_round(target, tree, budget, prompt, ar, value))
        finally:
            getattr(target.model, setter)(restore)
    assert runs[0][0] == runs[1][0], f"{settings[1]} drafted other trees than {settings[0]}"
    assert runs[0][1:] == runs[1][1:], f"{settings[1]}'s foresight stage drafted other candidate trees"
