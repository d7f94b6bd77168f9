"""`specbench head-convert`'s work: store a trained head in another kind, int4 / int3 optionally rounded by GPTQ
on the head's own inputs (specbench/drafters/heads/gptq.py says why).

Calibration drafts by exact replay (specbench.bench.replay) on the greedy continuations of training
prompts (GSM8K train, MBPP train, ShareGPT: never an evaluation item), with the drafter_args its
`Weights.calibrate` declares, so every trained weight sees the inputs it sees when drafting (jetspec++
drafts with foresight on: only the foresight blocks read the adapter's lower taps).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from specbench.drafters.heads.checkpoint import (CONFIG_FILE, GROUP, GROUP_BITS, WEIGHTS_FILE, dequantize_groups,
                                                 load_head, quantize_groups, save_state)
from specbench.drafters.heads.gptq import InputGrams, drafter_weights, output_error, quantize_state
from specbench.models.target import TargetModel


@dataclass
class Conversion:
    """What a conversion wrote: sizes, and per calibrated weight the output error of plain rounding vs GPTQ."""

    src_bytes: int
    dest_bytes: int
    errors: dict[str, tuple[float, float]]  # name -> (plain rounding, gptq) relative output error
    uncalibrated: list[str]  # 2-D weights no calibration input reached (rounded plainly)
    rows: int  # calibration input rows seen (the most any weight saw)

    def summary(self) -> str:
        if not self.errors:
            return ""
        plain = sum(p for p, _ in self.errors.values()) / len(self.errors)
        gptq = sum(g for _, g in self.errors.values()) / len(self.errors)
        out = (f"GPTQ on {len(self.errors)} weights ({self.rows:,} input rows): mean relative output error "
               f"{plain:.4f} plain -> {gptq:.4f}")
        if self.uncalibrated:
            out += f"; rounded plainly (no calibration input): {', '.join(self.uncalibrated)}"
        return out


@torch.no_grad()
def input_grams(drafter: object, prompts: Sequence[Sequence[int]], tree: str, budget: int, max_new_tokens: int,
                weights: dict[str, torch.Tensor]) -> InputGrams:
    """Input Gram matrices of `weights` while `drafter` drafts by exact replay on `prompts`."""
    from specbench.bench.replay import build_references, replay, replay_decoder
    from specbench.trees import TREE_POLICIES

    policy = TREE_POLICIES.build(tree)
    decoder = replay_decoder(drafter, policy, budget)  # type: ignore[arg-type]
    grams = InputGrams(weights)
    for ref in build_references(drafter.target, prompts, max_new_tokens, drafter.taps):  # type: ignore[attr-defined]
        with grams:
            replay(drafter, ref, policy, budget, max_new_tokens, decoder=decoder)  # type: ignore[arg-type]
    return grams


def convert_head(src: Path, dest: Path, target: TargetModel, storage: str, *, prompts: Sequence[Sequence[int]] = (),
                 tree: str | None = None, budget: int = 64, max_new_tokens: int = 128,
                 group: int = GROUP) -> Conversion:
    """Write the head in `src` to `dest` as `storage`; with `prompts` (int4 / int3 only), GPTQ-rounded on
    the inputs the head sees while drafting them."""
    import json

    from specbench.drafters import DRAFTERS

    state, config = load_head(src, target)
    codes, errors, uncalibrated, rows = {}, {}, [], 0
    if prompts:
        if storage not in GROUP_BITS:
            raise ValueError(f"calibration rounds group codes (int4, int3); --storage is {storage!r} (pass "
                             f"--storage int4 or int3, or drop --calibrate)")
        bits = GROUP_BITS[storage]
        kind = json.loads((src / CONFIG_FILE).read_text())["head"]["drafter"]
        cls = DRAFTERS.get(kind)
        tree = tree or ("ddtree" if "ddtree" in cls.policy_names() else cls.policy_names()[0])
        drafter = DRAFTERS.build(kind, target, checkpoint=str(src), **cls.weights.calibrate)
        live = drafter_weights(drafter, state)
        grams = input_grams(drafter, prompts, tree, budget, max_new_tokens, live)
        codes = quantize_state(state, grams.grams, group, bits)
        rows = max(grams.rows.values(), default=0)
        for name, (c, s, lo) in codes.items():
            w, gram = state[name].float(), grams.grams[name]
            plain = dequantize_groups(*quantize_groups(w, bits, group), w.shape[1], bits)
            rounded = dequantize_groups(c, s, lo, w.shape[1], bits)
            errors[name] = (output_error(w, plain, gram), output_error(w, rounded, gram))
        uncalibrated = sorted(n for n, t in state.items() if t.ndim == 2 and t.is_floating_point() and n not in codes)
    save_state(dest, state, config, target, storage=storage, codes=codes, group=group)
    return Conversion((src / WEIGHTS_FILE).stat().st_size, (dest / WEIGHTS_FILE).stat().st_size, errors,
                      uncalibrated, rows)
