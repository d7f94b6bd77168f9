"""The shared trainer: losses fall on a tiny target, several heads train on one target forward, and an
interrupted run resumes to exactly the state of an uninterrupted one."""

from __future__ import annotations

import math

import pytest
import torch

from specbench.train import OBJECTIVES
from specbench.train.losses import cross_entropy, forward_kl, position_decay, reverse_kl
from specbench.train.trainer import TrainConfig, Trainer, lr_factor

HEADS = ("dflash", "jetspec", "jetspec-tree")


def make_trainer(target, sequences, out, steps: int) -> Trainer:
    objectives = {n: OBJECTIVES.build(n, target, num_layers=1, block_size=5, anchors=6, init_seed=2) for n in HEADS}
    config = TrainConfig(batch_size=4, steps=steps, lr=3e-3, save_every=0, seed=7)
    return Trainer(target, objectives, sequences, config, out)


def test_losses_fall(tiny_target, tiny_sequences, tmp_path) -> None:
    trainer = make_trainer(tiny_target, tiny_sequences, tmp_path, steps=24)
    history = [trainer.train_step() for _ in range(24)]
    for name in HEADS:
        first = sum(h[f"{name}/loss"] for h in history[:4]) / 4
        last = sum(h[f"{name}/loss"] for h in history[-4:]) / 4
        assert last < 0.8 * first, f"{name}: loss {first:.4f} -> {last:.4f}"


def test_resume_equals_uninterrupted(tiny_target, tiny_sequences, tmp_path) -> None:
    straight = make_trainer(tiny_target, tiny_sequences, tmp_path / "a", steps=6)
    straight.train(progress=False)
    interrupted = make_trainer(tiny_target, tiny_sequences, tmp_path / "b", steps=6)
    interrupted.train(steps=3, progress=False)  # saves its state at the stop
    resumed = make_trainer(tiny_target, tiny_sequences, tmp_path / "b", steps=6)
    assert resumed.load_state() and resumed.step == 3
    resumed.train(progress=False)
    a, b = straight.state_dict(), resumed.state_dict()
    assert a["step"] == b["step"] == 6 and a["data"] == b["data"]
    for name in HEADS:
        for key, t in a["heads"][name].items():
            assert torch.equal(t, b["heads"][name][key]), f"{name}.{key}"
        sa, sb = a["optimizers"][name]["state"], b["optimizers"][name]["state"]
        for idx in sa:
            assert torch.equal(sa[idx]["exp_avg"], sb[idx]["exp_avg"])
    assert torch.equal(a["generator"], b["generator"])


def test_trainer_calls_prepare_with_response_counts(tiny_target, tiny_sequences, tmp_path) -> None:
    seen = {}

    class Probe(type(OBJECTIVES.build("jetspec", tiny_target, block_size=3))):  # a jetspec objective that records prepare
        def prepare(self, token_counts):
            seen["counts"] = token_counts

    obj = Probe(tiny_target, block_size=3, anchors=2)
    Trainer(tiny_target, {"jetspec": obj}, tiny_sequences, TrainConfig(batch_size=2, steps=1), tmp_path)
    want = torch.bincount(torch.tensor([t for s in tiny_sequences for t in s.response]), minlength=tiny_target.config.vocab_size)
    assert torch.equal(seen["counts"], want)


def test_block_samples_follow_the_recipe(tiny_target, tiny_sequences) -> None:
    """Anchors are response tokens followed by one; clean inputs are the true tokens; labels are the
    next (clean) or in-place (MASK) tokens; P[m = 0] is about 0.25 for jetspec-tree."""
    from specbench.train.trainer import SequenceBatches, target_batch

    obj = OBJECTIVES.build("jetspec-tree", tiny_target, block_size=5, anchors=6)
    data = SequenceBatches(tiny_sequences, 6, 256, 0)
    tokens, valid, loss_mask = data.collate(data.next(), tiny_target.device)
    batch = target_batch(tiny_target, tokens, valid, loss_mask, obj.taps)
    g = torch.Generator().manual_seed(0)
    zero_prefix, blocks = 0, 0
    for _ in range(20):
        blk = obj.sample_blocks(batch, g)
        keep = blk["keep"]
        a = blk["anchors"]
        rows = torch.arange(tokens.shape[0])[:, None].expand_as(a)
        assert bool(loss_mask[rows, a][keep].all()) and bool(loss_mask[rows, a + 1][keep].all())
        concrete = ~blk["is_mask"]
        pos = blk["pos"].clamp(max=tokens.shape[1] - 1)
        assert torch.equal(blk["tokens"][concrete], tokens[rows[..., None].expand_as(pos), pos][concrete])
        want_label = torch.where(concrete, blk["pos"] + 1, blk["pos"])
        has = blk["has_label"]
        assert torch.equal(blk["label_pos"][has], want_label[has])
        m = concrete.sum(-1) - 1
        zero_prefix += int((m[keep] == 0).sum())
        blocks += int(keep.sum())
    assert 0.1 < zero_prefix / blocks < 0.45  # 0.25 nominal (plus blocks cut short at the sequence end)


def test_training_blocks_match_the_drafter(tiny_target, tiny_sequences) -> None:
    """A block inside the training forward (all blocks at once, block mask) gives the same head
    output as the drafter running that block against its cache at inference."""
    from specbench.config import SamplingConfig
    from specbench.drafters.base import DraftState
    from specbench.drafters.heads.parallel import JetSpecDrafter
    from specbench.drafters.heads.masks import uniform_blocks_mask
    from specbench.train.trainer import SequenceBatches, target_batch
    from specbench.verify.base import TorchRandomness

    obj = OBJECTIVES.build("jetspec", tiny_target, block_size=5, anchors=4, init_seed=3)
    data = SequenceBatches(tiny_sequences, 1, 256, 0)
    tokens, valid, loss_mask = data.collate(data.next(), tiny_target.device)
    batch = target_batch(tiny_target, tokens, valid, loss_mask, obj.taps)
    blk = obj.sample_blocks(batch, torch.Generator().manual_seed(1))
    model, b, T = tiny_target.model, 5, tokens.shape[1]
    with torch.no_grad():
        feats = torch.cat([batch.hidden[t] for t in obj.taps], dim=-1)
        ctx_kv = obj.head.context_kv(feats, torch.arange(T)[None], model)
        x = obj.head.embed_block(blk["tokens"].view(1, -1), blk["is_mask"].view(1, -1), model)
        hidden = obj.head(x, blk["pos"].view(1, -1), ctx_kv, uniform_blocks_mask(blk["anchors"], b, "block-causal", T), model)
        logp = torch.log_softmax(obj.head.logits(hidden, obj.lm_head_weight), -1).view(-1, b, tiny_target.config.vocab_size)
    drafter = JetSpecDrafter(tiny_target, head=obj.head)
    checked = 0
    for g in range(blk["anchors"].shape[1]):
        if not bool(blk["keep"][0, g]) or bool(blk["is_mask"][0, g, 1:].logical_not().any()):
            continue  # compare MASK blocks (what the jetspec drafter runs)
        a = int(blk["anchors"][0, g])
        seq = tokens[0, : a + 1].tolist()
        state = DraftState(tokens=seq, prompt_len=a, sampling=SamplingConfig(), draft_rng=TorchRandomness(0))
        from specbench.models.decoder import ForwardOutput

        drafter.begin(state, ForwardOutput(logits=torch.empty(0), hidden={t: batch.hidden[t][:, :a] for t in obj.taps}), 128)
        torch.testing.assert_close(drafter.block_logp(state), logp[g, 1:], atol=1e-4, rtol=1e-4)
        checked += 1
    assert checked > 0


def test_loss_functions() -> None:
    torch.manual_seed(0)
    s, t = torch.randn(5, 11), torch.randn(5, 11)
    w = torch.rand(5)
    assert float(forward_kl(t, t, w)) == pytest.approx(0.0, abs=1e-6)
    assert float(reverse_kl(s, s, w)) == pytest.approx(0.0, abs=1e-6)
    p, q = torch.softmax(t / 2, -1), torch.softmax(s / 2, -1)
    manual = ((p * (p.log() - q.log())).sum(-1) * w).sum() / w.sum() * 4
    assert float(forward_kl(s, t, w, temperature=2.0)) == pytest.approx(float(manual), rel=1e-5)
    labels = torch.tensor([0, 3, 5, 1, 10])
    ce = torch.nn.functional.cross_entropy(s, labels, reduction="none")
    assert float(cross_entropy(s, labels, w)) == pytest.approx(float((ce * w).sum() / w.sum()), rel=1e-6)
    decay = position_decay(torch.tensor([1, 2, 3]), 7.0)
    assert decay.tolist() == pytest.approx([1.0, math.exp(-1 / 7), math.exp(-2 / 7)])
    assert position_decay(torch.tensor([1, 5]), None).tolist() == [1.0, 1.0]


def test_lr_schedule_warms_up_then_decays() -> None:
    lrs = [lr_factor(s, 100, 0.04, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.25) and lrs[3] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:])) and lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_bad_objective_settings_fail_at_once(tiny_target) -> None:
    with pytest.raises(ValueError, match="unknown setting"):
        OBJECTIVES.build("dflash", tiny_target, blocksize=4)
    with pytest.raises(ValueError, match="losses must give"):
        OBJECTIVES.build("dflash", tiny_target, losses={"mse": 1.0})
