"""jetspec++ training: the J0, refinement and adapter losses fall under every fill; the refinement
inputs follow the recipe (clean prefix of true tokens, Pr[m = 0] = 0.25, the fill elsewhere); a resumed
run equals an uninterrupted one; `specbench train --drafter jetspec++` exports a loadable head; the
held-out metrics see the adapter beat stale states and the decoder reproduce the target on true states."""

from __future__ import annotations

import pytest
import torch

from specbench.train import OBJECTIVES
from specbench.train.trainer import SequenceBatches, TrainConfig, Trainer, target_batch


def objective(tiny, **kw):  # type: ignore[no-untyped-def]
    return OBJECTIVES.build("jetspec++", tiny, **{"num_layers": 1, "block_size": 5, "anchors": 6, "init_seed": 2,
                                                  "taps": [0], **kw})


@pytest.mark.parametrize("fill", ["self", "random", "mask"])
def test_losses_fall(tiny, tiny_sequences, tmp_path, fill: str) -> None:
    trainer = Trainer(tiny, {"jetspec++": objective(tiny, fill=fill)}, tiny_sequences,
                      TrainConfig(batch_size=4, steps=30, lr=3e-3, save_every=0, seed=7), tmp_path)
    history = [trainer.train_step() for _ in range(30)]
    for key in ("j0_fkl", "refine_fkl", "adapter_loss"):
        first = sum(h[f"jetspec++/{key}"] for h in history[:4]) / 4
        last = sum(h[f"jetspec++/{key}"] for h in history[-4:]) / 4
        assert last < 0.7 * first, f"{fill}/{key}: {first:.4f} -> {last:.4f}"


def a_batch(tiny, sequences, obj):  # type: ignore[no-untyped-def]
    data = SequenceBatches(sequences, 6, 256, 0)
    tokens, valid, loss_mask = data.collate(data.next(), tiny.device)
    return target_batch(tiny, tokens, valid, loss_mask, obj.taps)


@pytest.mark.parametrize("fill", ["self", "random", "mask"])
def test_refinement_inputs_follow_the_recipe(tiny, tiny_sequences, fill: str) -> None:
    obj = objective(tiny, fill=fill)
    assert obj.settings["p_mask_only"] == 0.25 and obj.settings["losses"] == {"fkl": 1.0}
    batch = a_batch(tiny, tiny_sequences, obj)
    g = torch.Generator().manual_seed(0)
    zero, blocks = 0, 0
    for _ in range(20):
        blk = obj.sample_blocks(batch, g)
        clean = ~blk["is_mask"]
        B, G, b = clean.shape
        logits0 = torch.randn(B, G, b - 1, tiny.config.vocab_size)
        inputs, is_mask = obj.refine_inputs(blk["tokens"], clean, logits0, g)
        assert torch.equal(inputs[clean], blk["tokens"][clean])  # the clean prefix: true tokens
        assert bool(clean[:, :, 0].all())
        m = clean.sum(-1) - 1
        assert torch.equal(clean, torch.arange(b) <= m[..., None])  # a prefix
        if fill == "self":
            assert torch.equal(inputs[:, :, 1:][~clean[:, :, 1:]], logits0.argmax(-1)[~clean[:, :, 1:]])
        if fill == "mask":
            assert torch.equal(is_mask, ~clean)
        else:
            assert not bool(is_mask.any())
        room = (batch.valid.sum(1)[:, None] - 1 - blk["anchors"]) >= b - 1  # m is not cut by the sequence end
        sel = blk["keep"] & room
        zero += int((m[sel] == 0).sum())
        blocks += int(sel.sum())
    assert 0.15 < zero / blocks < 0.35


def test_resume_equals_uninterrupted(tiny, tiny_sequences, tmp_path) -> None:
    def make(out, steps):  # type: ignore[no-untyped-def]
        return Trainer(tiny, {"jetspec++": objective(tiny)}, tiny_sequences,
                       TrainConfig(batch_size=4, steps=steps, lr=3e-3, save_every=0, seed=7), out)

    straight = make(tmp_path / "a", 4)
    straight.train(progress=False)
    interrupted = make(tmp_path / "b", 4)
    interrupted.train(steps=2, progress=False)
    resumed = make(tmp_path / "b", 4)
    assert resumed.load_state() and resumed.step == 2
    resumed.train(progress=False)
    a, b = straight.state_dict()["heads"]["jetspec++"], resumed.state_dict()["heads"]["jetspec++"]
    assert any(k.startswith("adapter.") and k.endswith("stats_ready") for k in a)
    for key, t in a.items():
        assert torch.equal(t, b[key]), key


def test_bad_settings_are_refused(tiny) -> None:
    with pytest.raises(ValueError, match="fill must be one of"):
        objective(tiny, fill="noise")
    with pytest.raises(ValueError, match="adapter_layers"):
        objective(tiny, taps=[0, 1], adapter_layers=[1, 1, 1])
    with pytest.raises(ValueError, match="head attention"):
        objective(tiny, attention="sideways")
    with pytest.raises(ValueError, match="nothing to train"):
        objective(tiny, mask_weight=0, refine_weight=0, adapter=False)


def test_adapter_only_training_leaves_the_head_alone(tiny, tiny_sequences, tmp_path) -> None:
    """mask_weight = refine_weight = 0 trains the adapter alone (a phase of a two-phase recipe)."""
    obj = objective(tiny, mask_weight=0, refine_weight=0)
    before = {k: v.clone() for k, v in obj.draft.state_dict().items()}
    trainer = Trainer(tiny, {"jetspec++": obj}, tiny_sequences, TrainConfig(batch_size=4, steps=3, lr=3e-3, save_every=0),
                      tmp_path)
    metrics = [trainer.train_step() for _ in range(3)]
    assert all("jetspec++/adapter_loss" in m and "jetspec++/j0_fkl" not in m for m in metrics)
    for k, v in obj.draft.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_cli_trains_a_loadable_head(tmp_path) -> None:
    from specbench.config import SpecConfig
    from specbench.drafters.jetspecpp.drafter import JetSpecPPDrafter
    from specbench.engine import SpecDecoder
    from specbench.models import load_target
    from specbench.train.cli import main

    args = ["train", "--drafter", "jetspec++", "--target", "random:tiny-llama", "--synthetic-prompts", "6",
            "--max-new-tokens", "12", "--batch-size", "3", "--head-arg", "block_size=4", "--head-arg", "anchors=3",
            "--head-arg", "jetspec++:adapter_layers=[1, 2]", "--quiet", "--out", str(tmp_path), "--steps", "2"]
    assert main(args) == 0
    target = load_target("random:tiny-llama")
    drafter = JetSpecPPDrafter(target, checkpoint=str(tmp_path / "heads" / "jetspec++"), J=2, R=1)
    assert drafter.adapter is not None and drafter.adapter.config.layers == (1, 2)
    decoder = SpecDecoder(target, SpecConfig(drafter="jetspec++", tree="chain", budget=3), max_seq_len=64, drafter=drafter)
    assert len(decoder.generate([3, 4, 5], 6).tokens) == 6


def test_held_out_metrics(tiny, tiny_sequences, trained_jpp) -> None:
    from specbench.train.jetspecpp_eval import evaluate_states

    obj, _ = trained_jpp
    held_out = tiny_sequences[-6:]
    report = evaluate_states(tiny, obj.adapter.eval(), held_out, anchors_per_seq=4)
    assert report["blocks"] > 0
    row = report["taps"][0]
    assert len(row["pred_err_by_offset"]) == 6
    assert row["pred_err"] < row["stale_err"] and row["pred_cos"] > row["stale_cos"]
    dec = report["decoder"]
    assert dec["true_top1"] == 1.0 and dec["true_kl"] < 1e-8  # the decoder itself is exact
    assert 0.0 < dec["top1"] <= 1.0 and dec["kl"] > dec["true_kl"]


def test_init_from_a_trained_head(tiny, trained_jpp) -> None:
    obj, directory = trained_jpp
    fresh = objective(tiny, block_size=6, init_from=str(directory))
    for key, t in obj.head.state_dict().items():
        torch.testing.assert_close(fresh.head.state_dict()[key].float(), t.float())
    with pytest.raises(ValueError, match="block_size"):
        objective(tiny, block_size=5, init_from=str(directory))
