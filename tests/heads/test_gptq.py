"""GPTQ int4 / int3 rounding of heads: the input Gram matrices it reads are exact, it beats plain rounding on
the output error it minimises, and converting a trained head reaches every weight that drafting uses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specbench.drafters.heads.checkpoint import GROUP, dequantize_groups, quantize_groups
from specbench.drafters.heads.gptq import InputGrams, gptq_round, output_error


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


def test_input_grams_split_a_batched_product_over_the_weights_it_stacks() -> None:
    """Weights that are rows of one stack (as the jetspec++ adapter's taps are) each get their own row's inputs."""
    g = torch.Generator().manual_seed(4)
    stack = torch.randn(3, 6, 8, generator=g)  # [T, out, in]
    weights = {f"tap{t}": stack[t] for t in range(3)}
    x = torch.randn(3, 5, 8, generator=g)  # [T, n, in]
    grams = InputGrams(weights)
    with grams:
        torch.bmm(x, stack.mT)
        torch.baddbmm(torch.zeros(2, 1, 6), x[1:], stack[1:].mT)  # the last two taps only
        F.linear(x[0], weights["tap0"])
    for t in range(3):
        rows = torch.cat([x[t], x[t]]).double()  # tap 0: bmm + linear; taps 1, 2: bmm + baddbmm
        torch.testing.assert_close(grams.grams[f"tap{t}"], rows.T @ rows)
    assert grams.rows == {"tap0": 10, "tap1": 10, "tap2": 10}


@pytest.mark.parametrize("bits", [4, 3])
def test_gptq_beats_plain_rounding_on_the_output_error(bits: int) -> None:
    g = torch.Generator().manual_seed(1)
    cols = 4 * GROUP
    w = torch.randn(48, cols, generator=g) * 0.05
    x = _correlated_inputs(2048, cols, sample_seed=2)
    gram = x.double().T @ x.double()
    plain = dequantize_groups(*quantize_groups(w, bits), cols, bits)
    in_order = output_error(w, dequantize_groups(*gptq_round(w, gram, bits=bits, act_order=False), cols, bits), gram)
    codes, scale, low = gptq_round(w, gram, bits=bits)
    assert codes.shape == (48, cols * bits // 8) and scale.shape == low.shape == (48, 4)
    rounded = dequantize_groups(codes, scale, low, cols, bits)
    e_plain, e_gptq = output_error(w, plain, gram), output_error(w, rounded, gram)
    assert e_gptq < 0.9 * e_plain and in_order < 0.9 * e_plain, (e_plain, in_order, e_gptq)
    assert e_gptq < in_order  # loud inputs first: act order wins on inputs of unequal scales
    # the error on held-out inputs of the same law falls too (it is not fitted to the calibration rows)
    held = _correlated_inputs(512, cols, sample_seed=3)
    assert float(((rounded - w) @ held.T).norm()) < float(((plain - w) @ held.T).norm())
    # each value is still one of its group's 2^bits levels
    levels = (rounded.view(48, 4, GROUP) - low.float()[:, :, None]) / scale.float()[:, :, None]
    torch.testing.assert_close(levels, levels.round().clamp(0, 2 ** bits - 1), atol=2e-3, rtol=0)


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


def test_converting_a_jetspecpp_head_calibrates_every_adapter_tap(tmp_path) -> None:
    """jetspec++ with two taps: the lower tap's adapter module is read only by foresight, which the
    drafter's declared calibration arguments turn on; without them that module would round plainly."""
    from specbench.drafters import DRAFTERS
    from specbench.drafters.heads.checkpoint import save_state
    from specbench.drafters.jetspecpp.model import JetSpecPPModel
    from specbench.models import load_target
    from specbench.train.head_quant import convert_head
    from specbench.train.regen import synthetic_prompt_ids

    tiny = load_target("random:tiny-llama")
    drafter = DRAFTERS.build("jetspec++", tiny, random_init=True, seed=2)
    assert drafter.taps == (0, 1) and DRAFTERS.get("jetspec++").weights.calibrate == {"foresight": "on"}
    model = JetSpecPPModel(drafter.head, drafter.adapter)
    save_state(tmp_path / "src", model.state_dict(), model.config(), tiny, storage="fp32")
    prompts = synthetic_prompt_ids(tiny.config.vocab_size, 2, 6, 10, seed=4)
    done = convert_head(tmp_path / "src", tmp_path / "int4", tiny, "int4", prompts=prompts, tree="chain", budget=6,
                        max_new_tokens=12)
    two_d = {n for n, t in model.state_dict().items() if t.ndim == 2}
    assert done.uncalibrated == [] and set(done.errors) == two_d
    assert any(n.startswith("adapter.modules_by_tap.0.") for n in done.errors)
    DRAFTERS.build("jetspec++", tiny, checkpoint=str(tmp_path / "int4"))
