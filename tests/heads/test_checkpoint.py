"""Head checkpoints: exact fp32 round trip, int8 within its rounding bound, int4 and int3 codes packed
losslessly with each group's error no worse than plain min/max rounding, conversion between kinds, a clear error on
another target, and a target identity that does not depend on the dtype the target was loaded in."""

from __future__ import annotations

import json

import pytest
import torch

from specbench.drafters.heads.backbone import DraftHead, HeadConfig
from specbench.drafters.heads.checkpoint import (GROUP, HeadCheckpointError, dequantize_groups, load_head, pack_codes,
                                                 quantize_groups, quantize_int8, save_head, unpack_codes)
from specbench.drafters.heads.parallel import JetSpecDrafter
from specbench.models import load_target

from head_helpers import random_head


def test_fp32_round_trip_is_exact(tiny, tmp_path) -> None:
    head = random_head(tiny, "jetspec", seed=5)
    save_head(tmp_path, head, head.config.to_dict(), tiny, storage="fp32")
    state, config = load_head(tmp_path, tiny)
    assert HeadConfig.from_dict(config) == head.config
    for name, t in head.state_dict().items():
        assert torch.equal(state[name], t), name
    drafter = JetSpecDrafter(tiny, checkpoint=str(tmp_path))
    assert drafter.taps == head.config.taps


def test_int8_round_trip_within_half_a_step(tiny, tmp_path) -> None:
    head = random_head(tiny, "dflash", seed=6)
    save_head(tmp_path, head, head.config.to_dict(), tiny, storage="int8")
    state, _ = load_head(tmp_path, tiny)
    for name, t in head.state_dict().items():
        if t.ndim == 2:
            step = t.abs().amax(dim=1, keepdim=True) / 127
            assert bool(((state[name] - t).abs() <= step / 2 + 1e-7).all()), name
            assert not torch.equal(state[name], t)
        else:
            assert torch.equal(state[name], t), name
    rebuilt = DraftHead(tiny.config, head.config)
    rebuilt.load_state_dict(state)


def test_quantize_int8_uses_per_row_scales() -> None:
    w = torch.tensor([[1.0, -0.5, 0.25], [100.0, 50.0, -100.0]])
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (2, 1)
    assert q[0].tolist() == [127, -64, 32] and q[1].tolist() == [127, 64, -127]
    torch.testing.assert_close(q.float() * scale, w, atol=float(scale.max()) / 2, rtol=0)


@pytest.mark.parametrize("bits", [4, 3])
def test_codes_pack_and_unpack_exactly(bits: int) -> None:
    g = torch.Generator().manual_seed(bits)
    q = torch.randint(0, 2 ** bits, (7, 3 * 64), generator=g, dtype=torch.uint8)
    packed = pack_codes(q, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (7, 3 * 64 * bits // 8)
    assert torch.equal(unpack_codes(packed, bits), q)
    if bits == 4:  # the layout int4 heads were written in: low nibble first
        assert torch.equal(packed, q[:, 0::2] | (q[:, 1::2] << 4))


@pytest.mark.parametrize("bits", [4, 3])
def test_group_codes_dequantize_to_their_levels(bits: int) -> None:
    g = torch.Generator().manual_seed(0)
    top = 2 ** bits - 1
    w = torch.randn(5, 2 * GROUP + 10, generator=g)  # a ragged last group: padded, cut at load
    codes, scale, low = quantize_groups(w, bits)
    assert codes.dtype == torch.uint8 and codes.shape == (5, 3 * GROUP * bits // 8)
    assert scale.dtype == low.dtype == torch.float16 and scale.shape == low.shape == (5, 3)
    back = dequantize_groups(codes, scale, low, w.shape[1], bits)
    assert back.shape == w.shape
    # every value is one of its group's 2^bits levels, and re-quantizing the dequantized weight is a fixed
    # point on the full groups (the ragged one shares its group with padding zeros, which are not on its levels)
    levels = (back[:, :GROUP] - low[:, :1].float()) / scale[:, :1].float()
    torch.testing.assert_close(levels, levels.round(), atol=1e-3, rtol=0)
    assert float(levels.min()) > -1e-3 and float(levels.max()) < top + 1e-3
    codes2, scale2, low2 = quantize_groups(back, bits)
    full = 2 * GROUP
    torch.testing.assert_close(dequantize_groups(codes2, scale2, low2, w.shape[1], bits)[:, :full], back[:, :full],
                               atol=1e-3, rtol=0)
    if bits == 3:
        with pytest.raises(ValueError, match="multiple of 8"):
            quantize_groups(w, 3, group=12)


@pytest.mark.parametrize("bits", [4, 3])
def test_group_clipping_never_does_worse_than_min_max_rounding(bits: int) -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 4 * GROUP, generator=g)
    back = dequantize_groups(*quantize_groups(w, bits), w.shape[1], bits)
    grouped = w.view(64, 4, GROUP)
    lo, hi = grouped.amin(2, keepdim=True), grouped.amax(2, keepdim=True)
    step = (hi - lo) / (2 ** bits - 1)
    plain = torch.round((grouped - lo) / step) * step + lo
    err = ((back.view(64, 4, GROUP) - grouped) ** 2).sum(2)  # [rows, groups]
    plain_err = ((plain - grouped) ** 2).sum(2)
    assert bool((err <= plain_err * 1.01 + 1e-6).all())  # never worse (fp16 scales round a little)
    assert float(err.sum()) < 0.97 * float(plain_err.sum())  # and a clipped range wins on Gaussian groups
    assert float((back - w).abs().max()) > float(step.max()) / 2  # ... at the extremes' cost


def test_int4_head_round_trip_and_conversion(tiny, tmp_path) -> None:
    from specbench.drafters.heads.checkpoint import save_state

    head = random_head(tiny, "jetspec", seed=7)
    save_head(tmp_path / "i8", head, head.config.to_dict(), tiny, storage="int8")
    save_head(tmp_path / "i4", head, head.config.to_dict(), tiny, storage="int4")
    state4, config = load_head(tmp_path / "i4", tiny)
    assert json.loads((tmp_path / "i4" / "config.json").read_text())["storage"] == "int4"
    for name, t in head.state_dict().items():
        if t.ndim == 2:
            rel = float((state4[name] - t).norm() / t.norm())
            assert 0 < rel < 0.15, (name, rel)
        else:
            assert torch.equal(state4[name], t), name
    JetSpecDrafter(tiny, checkpoint=str(tmp_path / "i4"))  # loads into the drafter
    state8, _ = load_head(tmp_path / "i8", tiny)
    save_state(tmp_path / "i8to4", state8, config, tiny, storage="int4")
    save_state(tmp_path / "i3", state4, config, tiny, storage="int3")
    state3, _ = load_head(tmp_path / "i3", tiny)
    for name, t in head.state_dict().items():
        if t.ndim == 2:  # three bits: about twice int4's error, still a rounding of the same weight
            rel = float((state3[name] - t).norm() / t.norm())
            assert 0 < rel < 0.3, (name, rel)
    JetSpecDrafter(tiny, checkpoint=str(tmp_path / "i3"))
    size = {k: (tmp_path / k / "head.safetensors").stat().st_size for k in ("i8", "i4", "i8to4", "i3")}
    assert size["i4"] < 0.65 * size["i8"] and size["i8to4"] == size["i4"] and size["i3"] < 0.85 * size["i4"]
    with pytest.raises(ValueError, match="--head-storage"):
        save_head(tmp_path / "bad", head, head.config.to_dict(), tiny, storage="int2")


def test_head_for_another_target_is_refused(tiny, tmp_path) -> None:
    head = random_head(tiny, "dflash")
    save_head(tmp_path, head, head.config.to_dict(), tiny, storage="int8")
    other = load_target("random:tiny-llama@1")
    with pytest.raises(HeadCheckpointError, match="trained for target"):
        load_head(tmp_path, other)


def test_not_a_checkpoint_is_refused(tiny, tmp_path) -> None:
    with pytest.raises(HeadCheckpointError, match="not a head checkpoint"):
        load_head(tmp_path, tiny)
    head = random_head(tiny, "dflash")
    save_head(tmp_path, head, head.config.to_dict(), tiny, storage="fp32")
    meta = json.loads((tmp_path / "config.json").read_text())
    meta["format_version"] = 99
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(HeadCheckpointError, match="unknown format"):
        load_head(tmp_path, tiny)


def test_identity_is_the_same_in_bf16_and_fp32() -> None:
    a = load_target("random:tiny-llama", dtype="float32")
    b = load_target("random:tiny-llama", dtype="bfloat16")
    c = load_target("random:tiny-llama@2", dtype="float32")
    assert a.fingerprint == b.fingerprint != c.fingerprint


def test_head_loads_in_the_target_dtype(tmp_path) -> None:
    t32 = load_target("random:tiny-llama", dtype="float32")
    t16 = load_target("random:tiny-llama", dtype="bfloat16")
    head = random_head(t32, "jetspec")
    save_head(tmp_path, head, head.config.to_dict(), t32, storage="int8")
    state, _ = load_head(tmp_path, t16)
    assert all(v.dtype == torch.bfloat16 for v in state.values())
