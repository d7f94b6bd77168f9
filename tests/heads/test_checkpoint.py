"""Head checkpoints: exact fp32 round trip, int8 within its rounding bound, a clear error on another
target, and a target identity that does not depend on the dtype the target was loaded in."""

from __future__ import annotations

import json

import pytest
import torch

from specbench.drafters.heads.backbone import DraftHead, HeadConfig
from specbench.drafters.heads.checkpoint import HeadCheckpointError, load_head, quantize_int8, save_head
from specbench.drafters.heads.parallel import JetSpecDrafter
from specbench.models import load_target

from head_helpers import random_head


def test_fp32_round_trip_is_exact(tiny, tmp_path) -> None:
    head = random_head(tiny, "jetspec", seed=5)
    save_head(tmp_path, head, head.config.to_dict(), tiny, int8=False)
    state, config = load_head(tmp_path, tiny)
    assert HeadConfig.from_dict(config) == head.config
    for name, t in head.state_dict().items():
        assert torch.equal(state[name], t), name
    drafter = JetSpecDrafter(tiny, checkpoint=str(tmp_path))
    assert drafter.taps == head.config.taps


def test_int8_round_trip_within_half_a_step(tiny, tmp_path) -> None:
    head = random_head(tiny, "dflash", seed=6)
    save_head(tmp_path, head, head.config.to_dict(), tiny, int8=True)
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


def test_head_for_another_target_is_refused(tiny, tmp_path) -> None:
    head = random_head(tiny, "dflash")
    save_head(tmp_path, head, head.config.to_dict(), tiny, int8=True)
    other = load_target("random:tiny-llama@1")
    with pytest.raises(HeadCheckpointError, match="trained for target"):
        load_head(tmp_path, other)


def test_not_a_checkpoint_is_refused(tiny, tmp_path) -> None:
    with pytest.raises(HeadCheckpointError, match="not a head checkpoint"):
        load_head(tmp_path, tiny)
    head = random_head(tiny, "dflash")
    save_head(tmp_path, head, head.config.to_dict(), tiny, int8=False)
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
    save_head(tmp_path, head, head.config.to_dict(), t32, int8=True)
    state, _ = load_head(tmp_path, t16)
    assert all(v.dtype == torch.bfloat16 for v in state.values())
