"""The eagle3 head: tap convention, draft-vocabulary map, checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from targets import tiny_target

from specbench.drafters.eagle3.drafter import Eagle3Drafter, load_eagle3_head, random_head
from specbench.drafters.eagle3.head import Eagle3Head, eagle3_feature_layers, select_draft_vocab, target_to_draft
from specbench.drafters.heads.checkpoint import HeadCheckpointError, save_head


def test_feature_layers_are_the_inputs_of_layers_2_mid_and_L_minus_3() -> None:
    assert eagle3_feature_layers(30) == (1, 14, 26)  # SmolLM2-135M
    assert eagle3_feature_layers(36) == (1, 17, 32)  # Qwen3-8B
    assert eagle3_feature_layers(2) == (1, 0, 0)  # tiny targets: clamped into [0, L-1]


def test_taps_equal_the_inputs_eagle3_reads() -> None:
    """specbench tap l = output of layer l; EAGLE-3 reads the inputs of layers 2, L//2, L-3."""
    from specbench.models.decoder import AttentionMeta

    target = tiny_target(num_layers=10)
    model, L = target.model, 10
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(9)[None]
    out = target.forward(ids, pos, target.new_cache(9), None, eagle3_feature_layers(L))
    # the inputs of every layer, from the layers run one after the other as plain modules
    cache = target.new_cache(9)
    meta = AttentionMeta(lengths=cache.lengths, tree_mask=torch.ones(9, 9, dtype=torch.bool).tril()[None], kv_len=9)
    cos, sin = model.rope(pos)
    x, inputs = model.embed(ids), {}
    for i, layer in enumerate(model.layers):
        inputs[i] = x
        x = layer(x, cos, sin, cache.k[i], cache.v[i], pos, meta, model._attend)
    for tap, layer in zip(eagle3_feature_layers(L), (2, L // 2, L - 3)):
        torch.testing.assert_close(out.hidden[tap], inputs[layer], rtol=0, atol=0)


def test_draft_vocab_is_the_top_k_by_count_and_round_trips() -> None:
    V, K = 500, 64
    counts = torch.randint(0, 50, (V,), generator=torch.Generator().manual_seed(0))
    d2t = select_draft_vocab(counts, K)
    assert d2t.shape == (K,) and bool((d2t[1:] > d2t[:-1]).all())
    chosen = torch.zeros(V, dtype=torch.bool)
    chosen[d2t] = True
    assert int(counts[chosen].min()) >= int(counts[~chosen].max())
    # ties at the cut go to the lower ids
    cut = int(counts[chosen].min())
    tied = (counts == cut).nonzero().flatten()
    assert chosen[tied].tolist() == sorted(chosen[tied].tolist(), reverse=True)
    t2d = target_to_draft(d2t, V)
    assert torch.equal(t2d[d2t], torch.arange(K))
    assert int((t2d >= 0).sum()) == K
    inside = (t2d >= 0).nonzero().flatten()
    assert torch.equal(d2t[t2d[inside]], inside)


def test_draft_logp_maps_back_to_target_ids() -> None:
    target = tiny_target(num_layers=4)
    drafter = Eagle3Drafter(target, random_init=True, draft_vocab=32)
    d2t = torch.arange(0, 96, 3)
    drafter.head.set_draft_vocab(d2t)
    logp = torch.log_softmax(torch.randn(2, 32), -1)
    full = drafter.to_target_logp(logp)
    assert full.shape == (2, 96)
    torch.testing.assert_close(torch.logsumexp(full, -1), torch.zeros(2))
    assert torch.equal(full.argmax(-1), d2t[logp.argmax(-1)])
    with pytest.raises(ValueError, match="increasing"):
        drafter.head.set_draft_vocab(d2t.flip(0))


def test_checkpoint_round_trip_int8(tmp_path) -> None:
    target = tiny_target(num_layers=4)
    head = random_head(target, draft_vocab=40, seed=3)
    d2t = select_draft_vocab(torch.arange(96.0).flip(0) ** 2, 40)
    head.set_draft_vocab(d2t)
    save_head(tmp_path / "h", head, head.head_config(), target, storage="int8")
    meta = json.loads((tmp_path / "h" / "config.json").read_text())
    assert meta["head"]["drafter"] == "eagle3" and meta["storage"] == "int8"
    loaded = load_eagle3_head(tmp_path / "h", target)
    assert torch.equal(loaded.d2t, d2t), "the draft-vocabulary map must survive int8 storage exactly"
    assert loaded.feature_layers == head.feature_layers
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        if a.is_floating_point():
            tol = a.abs().amax().item() / 127 if a.ndim == 2 else 1e-6
            assert (a - b).abs().max().item() <= tol + 1e-7, name
    drafter = Eagle3Drafter(target, checkpoint=str(tmp_path / "h"))
    assert torch.equal(drafter.head.d2t, d2t)
    other = tiny_target(num_layers=4, seed=2)
    with pytest.raises(HeadCheckpointError, match="trained for target"):
        Eagle3Drafter(other, checkpoint=str(tmp_path / "h"))


def test_head_rejects_bad_config() -> None:
    cfg = tiny_target(num_layers=4).config
    with pytest.raises(ValueError, match="feature_layers"):
        Eagle3Head(cfg, (1, 4), 10)
    with pytest.raises(ValueError, match="draft_vocab"):
        Eagle3Head(cfg, (1, 2), 97)
