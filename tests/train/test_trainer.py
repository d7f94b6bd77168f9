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


def make_trainer(target, sequences, out, steps: int, **over) -> Trainer:
    objectives = {n: OBJECTIVES.build(n, target, num_layers=1, block_size=5, anchors=6, init_seed=2) for n in HEADS}
    config = TrainConfig(**{**dict(batch_size=4, steps=steps, lr=3e-3, save_every=0, seed=7), **over})
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


def test_bf16_autocast_trains_close_to_fp32(tiny_target, tiny_sequences, tmp_path) -> None:
    plain = make_trainer(tiny_target, tiny_sequences, tmp_path / "a", steps=24)
    mixed = make_trainer(tiny_target, tiny_sequences, tmp_path / "b", steps=24, autocast="bf16")
    first_plain, first_mixed = plain.train_step(), mixed.train_step()
    for name in HEADS:  # the same batch and draws: the losses differ by bf16 rounding only
        assert first_mixed[f"{name}/loss"] == pytest.approx(first_plain[f"{name}/loss"], rel=0.02)
    history = [first_mixed] + [mixed.train_step() for _ in range(23)]
    for name in HEADS:
        assert sum(h[f"{name}/loss"] for h in history[-4:]) < 0.8 * sum(h[f"{name}/loss"] for h in history[:4])
    assert all(p.dtype == torch.float32 for o in mixed.objectives.values() for p in o.head.parameters())
    with pytest.raises(ValueError, match="--autocast takes none, bf16 or head labels"):
        TrainConfig(autocast="dflash,,jetspec")
    with pytest.raises(ValueError, match=r"--autocast names \['fp16'\], which this run does not train"):
        make_trainer(tiny_target, tiny_sequences, tmp_path / "c", steps=2, autocast="fp16")


def test_train_config_checks_and_sorts() -> None:
    with pytest.raises(ValueError, match="--batch-size and --steps must be >= 1"):
        TrainConfig(batch_size=0)
    assert TrainConfig(snapshot_tokens=(2_000_000, 400_000)).snapshot_tokens == (400_000, 2_000_000)


def test_autocast_by_head_label(tiny_target, tiny_sequences, tmp_path) -> None:
    trainer = make_trainer(tiny_target, tiny_sequences, tmp_path, steps=2, autocast="jetspec-tree")
    assert trainer.autocast_heads == {"jetspec-tree"}
    x = torch.ones(2, 2)
    with trainer.head_precision("jetspec-tree"):
        assert torch.mm(x, x).dtype == torch.bfloat16
    with trainer.head_precision("dflash"):
        assert torch.mm(x, x).dtype == torch.float32
    assert TrainConfig(autocast="bf16").autocast_labels(["a", "b"]) == {"a", "b"}
    assert TrainConfig().autocast_labels(["a"]) == set()


def test_read_metrics_keeps_order_floats_and_nan() -> None:
    from specbench.train.objective import read_metrics

    out = read_metrics({"a": torch.tensor(1.5), "b": 2.0, "c": torch.tensor(float("nan")), "d": torch.tensor(3)})
    assert list(out) == ["a", "b", "c", "d"] and out["a"] == 1.5 and out["b"] == 2.0 and out["d"] == 3.0
    assert math.isnan(out["c"]) and all(isinstance(v, float) for v in out.values())


def test_non_finite_loss_stops_the_run_before_saving(tiny_target, tiny_sequences, tmp_path) -> None:
    from specbench.train.block_objective import DFlashObjective

    class Diverged(DFlashObjective):
        def loss(self, batch, generator):
            loss, parts = super().loss(batch, generator)
            return loss * float("nan"), parts

    objectives = {"dflash": Diverged(tiny_target, num_layers=1, block_size=5, anchors=6)}
    trainer = Trainer(tiny_target, objectives, tiny_sequences, TrainConfig(batch_size=4, steps=3, save_every=1), tmp_path)
    with pytest.raises(FloatingPointError, match="dflash: non-finite loss at step 0; lower the learning rate"):
        trainer.train(progress=False)
    assert not (tmp_path / "trainer_state.pt").exists()


def test_bad_objective_settings_fail_at_once(tiny_target) -> None:
    with pytest.raises(ValueError, match="unknown setting"):
        OBJECTIVES.build("dflash", tiny_target, blocksize=4)
    with pytest.raises(ValueError, match="losses must give"):
        OBJECTIVES.build("dflash", tiny_target, losses={"mse": 1.0})


# ---- at scale: validation, snapshots, schedules, moving states between machines ---------------------
def scale_trainer(target, sequences, out, steps: int, **over) -> Trainer:
    from specbench.train.sequences import TokenStore
    from specbench.train.validation import Validator

    store = TokenStore.from_sequences(sequences)
    train, val = store.select(torch.arange(3, len(store))), store.select(torch.arange(3))
    objectives = {"dflash": OBJECTIVES.build("dflash", target, block_size=4, anchors=3, init_seed=1),
                  "wide": OBJECTIVES.build("jetspec-tree", target, block_size=4, anchors=3, num_taps=1, init_seed=2),
                  "eagle3": OBJECTIVES.build("eagle3", target, draft_vocab=0, ttt_steps=2)}
    settings = dict(batch_size=3, steps=steps, lr=3e-3, save_every=0, seed=5, val_every=2, val_tau_every=3,
                    snapshot_tokens=(60, 150), log_every=1)
    config = TrainConfig(**{**settings, **over})
    validator = Validator(target, val, batch_size=2, max_len=256, tau_prompts=2, tau_budgets=(4, 8), tau_max_new_tokens=10)
    return Trainer(target, objectives, train, config, out, validator=validator, data_identity={"data": "tiny"})


def _log_rows(path):
    import json

    drop = {"time", "step_s", "tok_s", "resp_tok_s", "val_s"}
    return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in path.read_text().splitlines()]


def test_resume_with_validation_and_snapshots_equals_uninterrupted(tiny_target, tiny_sequences, tmp_path) -> None:
    straight = scale_trainer(tiny_target, tiny_sequences, tmp_path / "a", steps=7)
    straight.train(progress=False)
    first = scale_trainer(tiny_target, tiny_sequences, tmp_path / "b", steps=7)
    first.train(steps=4, progress=False)
    resumed = scale_trainer(tiny_target, tiny_sequences, tmp_path / "b", steps=7)
    assert resumed.load_state() and resumed.step == 4
    resumed.train(progress=False)
    a, b = straight.state_dict(), resumed.state_dict()
    assert a["tokens_seen"] == b["tokens_seen"] > 150 and a["snapshots_done"] == b["snapshots_done"] == [60, 150]
    for name in a["heads"]:
        for key, t in a["heads"][name].items():
            assert torch.equal(t, b["heads"][name][key]), f"{name}.{key}"
    rows_a, rows_b = _log_rows(tmp_path / "a" / "train_log.jsonl"), _log_rows(tmp_path / "b" / "train_log.jsonl")
    assert rows_a == rows_b
    vals = [r for r in rows_a if r.get("kind") == "val"]
    assert [r["step"] for r in vals] == [0, 2, 3, 4, 6, 7]
    assert all(1.0 <= r[f"val/{n}/tau8"] <= 9.0 for r in vals if "val/dflash/tau8" in r for n in ("dflash", "wide", "eagle3"))
    assert {"val/dflash/loss", "val/wide/acc", "val/eagle3/acc"} <= set(vals[-1])
    for milestone in (60, 150):
        d = f"snapshots/tok{milestone:010d}/wide/head.safetensors"
        assert (tmp_path / "a" / d).read_bytes() == (tmp_path / "b" / d).read_bytes()


def test_validation_is_deterministic_and_leaves_training_alone(tiny_target, tiny_sequences, tmp_path) -> None:
    trainer = scale_trainer(tiny_target, tiny_sequences, tmp_path, steps=4)
    gen, data = trainer.generator.get_state(), (trainer.data.epoch, trainer.data.cursor)
    one, two = trainer.validator.losses(trainer), trainer.validator.losses(trainer)
    assert one == two and torch.equal(gen, trainer.generator.get_state()) and data == (0, 0)
    assert trainer.validator.tau(trainer) == trainer.validator.tau(trainer)


def test_saved_state_is_all_cpu_and_compacts(tiny_target, tiny_sequences, tmp_path) -> None:
    import io

    from specbench.train.trainer import STATE_FILE, compact_state

    trainer = scale_trainer(tiny_target, tiny_sequences, tmp_path / "a", steps=8, val_every=0, val_tau_every=0)
    trainer.train(steps=3, progress=False)
    state = torch.load(tmp_path / "a" / STATE_FILE, weights_only=False)

    def devices(x):
        if isinstance(x, torch.Tensor):
            return {x.device.type}
        if isinstance(x, dict):
            return set().union(*map(devices, x.values())) if x else set()
        if isinstance(x, (list, tuple)):
            return set().union(*map(devices, x)) if x else set()
        return set()

    assert devices(state) == {"cpu"}
    small = compact_state(state, weights="bf16", moments="none")

    def size(s):
        buf = io.BytesIO()
        torch.save(s, buf)
        return buf.tell()

    assert size(small) < 0.25 * size(state)
    (tmp_path / "b").mkdir()
    torch.save(small, tmp_path / "b" / STATE_FILE)
    resumed = scale_trainer(tiny_target, tiny_sequences, tmp_path / "b", steps=8, val_every=0, val_tau_every=0,
                            rewarm_steps=4)
    assert resumed.load_state() and resumed.step == 3 and resumed.rewarm_from == 3
    base = lr_factor(3, 8, 0.04, 0.1)
    assert resumed.lr_scale() == pytest.approx(base / 4)
    w = resumed.objectives["dflash"].head.fc.weight
    assert w.dtype == torch.float32
    torch.testing.assert_close(w, trainer.objectives["dflash"].head.fc.weight, atol=0, rtol=2 ** -8)
    resumed.train(progress=False)
    assert resumed.step == 8


def test_resume_refuses_another_run(tiny_target, tiny_sequences, tmp_path) -> None:
    from specbench.train.trainer import ResumeError

    scale_trainer(tiny_target, tiny_sequences, tmp_path, steps=6, val_every=0, val_tau_every=0).train(steps=2, progress=False)
    with pytest.raises(ResumeError, match="--batch-size"):
        scale_trainer(tiny_target, tiny_sequences, tmp_path, steps=6, batch_size=2).load_state()
    with pytest.raises(ResumeError, match="--reschedule"):
        scale_trainer(tiny_target, tiny_sequences, tmp_path, steps=6).load_state(total_steps=9)
    longer = scale_trainer(tiny_target, tiny_sequences, tmp_path, steps=6)
    assert longer.load_state(total_steps=9, reschedule=True) and longer.total_steps == 9
    moved = scale_trainer(tiny_target, tiny_sequences, tmp_path, steps=6)
    moved.data_identity = {"data": "more"}
    with pytest.raises(ResumeError, match="--refresh-data"):
        moved.load_state()
    assert moved.load_state(refresh_data=True) and (moved.data.epoch, moved.data.cursor) == (1, 0)


def test_wsd_schedule_holds_then_decays() -> None:
    lrs = [lr_factor(s, 100, 0.05, 0.1, schedule="wsd", decay_frac=0.2) for s in range(100)]
    assert lrs[4] == pytest.approx(1.0) and all(v == 1.0 for v in lrs[5:80])
    assert all(a > b for a, b in zip(lrs[79:], lrs[80:])) and lrs[-1] == pytest.approx(0.1)


@pytest.mark.gpu
def test_cuda_state_resumes_on_the_cpu(tiny_sequences, tmp_path) -> None:
    from specbench.models import load_target

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    gpu = scale_trainer(load_target("random:tiny-llama", device="cuda"), tiny_sequences, tmp_path, steps=5,
                        val_every=0, val_tau_every=0)
    gpu.train(steps=2, progress=False)
    cpu = scale_trainer(load_target("random:tiny-llama"), tiny_sequences, tmp_path, steps=5, val_every=0, val_tau_every=0)
    assert cpu.load_state() and cpu.step == 2
    cpu.train(progress=False)
    assert cpu.step == 5
