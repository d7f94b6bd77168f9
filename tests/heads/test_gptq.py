"""GPTQ int4 rounding of heads: the input Gram matrices it reads are exact, it beats plain rounding on
the output error it minimises, and converting a trained head reaches every weight that drafting uses."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specbench.drafters.heads.checkpoint import INT4_GROUP, dequantize_int4, load_head, quantize_int4
from specbench.drafters.heads.gptq import InputGrams, gptq_int4, output_error


def _correlated_inputs(n: int, cols: int, sample_seed: int, law_seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(law_seed)
    mix = torch.randn(cols, cols, generator=g) / cols ** 0.5 + torch.eye(cols)  # correlated features
    scale = torch.logspace(-1, 1, cols)[torch.randperm(cols, generator=g)]  # a few loud inputs
    return torch.randn(n, cols, generator=torch.Generator().manual_seed(sample_seed)) @ mix * scale


def test_input_grams_are_exact_for_linear_products_and_row_slices() -> None:
    g = torch.Generator().manual_seed(0)
    w, other = torch.randn(12, 8, generator=g), torch.randn(12, 8, generator=g)
    x1, x2, x3 = torch.randn(5, 8, generator=g), torch.randn(2, 3, 8, generator=g), torch.randn(4, 8, generator=g)
    grams = InputGrams({"w": w})
    with grams:
        F.linear(x1, w)
        x2 @ w[4:].T  # a row slice counts for the whole weight
        F.linear(x3, other)  # not watched
    seen = torch.cat([x1, x2.reshape(-1, 8)]).double()
    torch.testing.assert_close(grams.grams["w"], seen.T @ seen)
    assert grams.rows == {"w": 11}


def test_gptq_beats_plain_rounding_on_the_output_error() -> None:
    g = torch.Generator().manual_seed(1)
    cols = 4 * INT4_GROUP
    w = torch.randn(48, cols, generator=g) * 0.05
    x = _correlated_inputs(2048, cols, sample_seed=2)
    gram = x.double().T @ x.double()
    plain = dequantize_int4(*quantize_int4(w), cols)
    codes, scale, low = gptq_int4(w, gram)
    assert codes.shape == (48, cols // 2) and scale.shape == low.shape == (48, 4)
    rounded = dequantize_int4(codes, scale, low, cols)
    e_plain, e_gptq = output_error(w, plain, gram), output_error(w, rounded, gram)
    assert e_gptq < 0.9 * e_plain, (e_plain, e_gptq)
    # the error on held-out inputs of the same law falls too (it is not fitted to the calibration rows)
    held = _correlated_inputs(512, cols, sample_seed=3)
    assert float(((rounded - w) @ held.T).norm()) < float(((plain - w) @ held.T).norm())
    # each value is still one of its group's 16 levels
    levels = (rounded.view(48, 4, INT4_GROUP) - low.float()[:, :, None]) / scale.float()[:, :, None]
    torch.testing.assert_close(levels, levels.round().clamp(0, 15), atol=2e-3, rtol=0)


def test_converting_trained_heads_calibrates_every_weight(tiny, trained_tiny_heads, tmp_path) -> None:
    from specbench.drafters.heads.checkpoint import save_head
    from specbench.drafters.heads.parallel import DFlashDrafter
    from specbench.train.head_quant import convert_head
    from specbench.train.regen import synthetic_prompt_ids

    prompts = synthetic_prompt_ids(tiny.config.vocab_size, 2, 6, 10, seed=3)
    for name in ("dflash", "jetspec-tree"):
        head = trained_tiny_heads[name]
        save_head(tmp_path / "fp32" / name, head, head.config.to_dict(), tiny, storage="fp32")
        done = convert_head(tmp_path / "fp32" / name, tmp_path / name, tiny, "int4", prompts=prompts, budget=8,
                            max_new_tokens=16)
        assert done.uncalibrated == [] and set(done.errors) == {n for n, t in head.state_dict().items() if t.ndim == 2}
        assert all(gptq <= plain * 1.05 for plain, gptq in done.errors.values()), done.errors
        assert done.dest_bytes < 0.25 * done.src_bytes  # fp32 -> int4
    DFlashDrafter(tiny, checkpoint=str(tmp_path / "dflash"))
