"""Training-time test: the attention pattern of the unrolled steps, equality with what the drafter
computes at test time, and a tiny objective that learns."""

from __future__ import annotations

import pytest
import torch
from eagle3_helpers import target_batch

from specbench.drafters.base import DraftState
from specbench.drafters.eagle3.drafter import Eagle3Drafter
from specbench.drafters.eagle3.head import Eagle3Head, eagle3_feature_layers
from specbench.config import SamplingConfig
from specbench.train import OBJECTIVES
from specbench.train.eagle3_objective import Eagle3Objective, shift_left, ttt_attention, ttt_forward, ttt_mask
from specbench.verify.base import TorchRandomness


def allowed(i: int, s: int, t: int, j: int) -> bool:
    """The TTT rule, stated directly: query (step s, row i) sees key (step t, row j)."""
    return (t == 0 and j <= i) or (1 <= t <= s and j == i)


@pytest.mark.parametrize("step", [0, 1, 3, 6])
def test_ttt_mask_is_causal_step0_plus_same_position_later_steps(step: int) -> None:
    T = 7
    mask = ttt_mask(T, step)
    assert mask.shape == (T, (step + 1) * T)
    for i in range(T):
        for t in range(step + 1):
            for j in range(T):
                assert bool(mask[i, t * T + j]) == allowed(i, step, t, j), (i, t, j)


@pytest.mark.parametrize("step", [1, 3])
def test_ttt_attention_gradients_follow_the_pattern(step: int) -> None:
    """Which keys/values each output actually depends on (autograd through the real backend, with GQA)."""
    B, H, Hkv, T, D = 1, 4, 2, 6, 8
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, T, D, generator=g)
    k = torch.randn(B, Hkv, (step + 1) * T, D, generator=g, requires_grad=True)
    v = torch.randn(B, Hkv, (step + 1) * T, D, generator=g, requires_grad=True)
    out = ttt_attention(q, k, v, None, D ** -0.5)
    for i in range(T):
        gk, gv = torch.autograd.grad(out[:, :, i].sum(), (k, v), retain_graph=True)
        for t in range(step + 1):
            for j in range(T):
                depends = bool(gk[..., t * T + j, :].abs().sum() > 0) or bool(gv[..., t * T + j, :].abs().sum() > 0)
                assert depends == allowed(i, step, t, j), (i, t, j)


def test_shift_left() -> None:
    x = torch.arange(10.0).view(1, 5, 2)
    assert torch.equal(shift_left(x, 2)[0, :3], x[0, 2:])
    assert not shift_left(x, 2)[0, 3:].any()
    assert not shift_left(x, 9).any()


def test_ttt_steps_equal_test_time_drafting(tiny8) -> None:
    """Row i of step s of the unrolled head = the drafter's distribution after drafting the true
    tokens x_{i+2}..x_{i+1+s} past the verified context x_0..x_{i+1} (cache + tree attention)."""
    target = tiny8
    cfg = target.config
    head = Eagle3Head(cfg, eagle3_feature_layers(cfg.num_layers), 48).init_weights(target.model, seed=5)
    head.set_draft_vocab(torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(1))[:48].sort().values)
    with torch.no_grad():  # non-trivial weights everywhere (init leaves norms at 1)
        for p in head.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    T, steps = 20, 4
    tokens = torch.randint(0, cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(2))
    out = target.forward(tokens, torch.arange(T)[None], target.new_cache(T), None, head.feature_layers)
    features = torch.cat([out.hidden[layer] for layer in head.feature_layers], dim=-1)
    with torch.no_grad():
        ttt = [torch.log_softmax(head.logits(h), -1) for h in ttt_forward(head, target.model.embed(tokens), features, steps)]
    drafter = Eagle3Drafter(target, head=head)
    seq = tokens[0].tolist()
    for i in (0, 5, 11):
        prefill = target.forward(tokens[:, : i + 1], torch.arange(i + 1)[None], target.new_cache(T), None, drafter.taps)
        state = DraftState(tokens=seq[: i + 2], prompt_len=i + 2, sampling=SamplingConfig(), draft_rng=TorchRandomness(0))
        drafter.begin(state, prefill, 64)
        with torch.inference_mode():
            logp = drafter.feed_context(state)
            torch.testing.assert_close(logp, ttt[0][0, i], rtol=1e-4, atol=1e-5)
            parent = torch.zeros(1, dtype=torch.long)
            for s in range(1, steps):
                # a sibling in the same frontier must not change the true path's distribution
                sibling = (seq[i + 1 + s] + 1) % cfg.vocab_size
                rows, logps = drafter.run_nodes(torch.tensor([sibling, seq[i + 1 + s]]), parent.repeat(2), s)
                torch.testing.assert_close(logps[1], ttt[s][0, i], rtol=1e-4, atol=1e-5)
                parent = rows[1:]


def test_ttt_steps_keep_one_key_dtype_under_autocast(tiny8, monkeypatch) -> None:
    """Under bf16 autocast every unrolled step's attention gets q, k and v of one dtype: the fed-back hidden is
    fp32 there, and a cache grown from it had promoted the keys of steps 1.. to fp32 (issue 14's training step)."""
    import specbench.train.eagle3_objective as objective_module

    seen: list[tuple[torch.dtype, ...]] = []
    sdpa = objective_module.F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.append((q.dtype, k.dtype, v.dtype))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(objective_module.F, "scaled_dot_product_attention", spy)
    cfg = tiny8.config
    head = Eagle3Head(cfg, eagle3_feature_layers(cfg.num_layers), 48).init_weights(tiny8.model, seed=5)
    tokens = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    features = torch.randn(2, 12, cfg.hidden_size * len(head.feature_layers), generator=torch.Generator().manual_seed(4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hiddens = ttt_forward(head, tiny8.model.embed(tokens), features, 4)
    assert len(hiddens) == 4 and len(seen) == 4
    assert all(dtypes == (torch.bfloat16,) * 3 for dtypes in seen), seen


def test_objective_is_registered_and_configured(tiny8) -> None:
    assert OBJECTIVES.get("eagle3") is Eagle3Objective
    obj = Eagle3Objective(tiny8, draft_vocab=32)
    assert obj.taps == tuple(sorted(set(eagle3_feature_layers(8))))
    assert obj.head_config()["draft_vocab"] == 32 and obj.head_config()["drafter"] == "eagle3"
    assert all(p.requires_grad for p in obj.head.parameters())
    with pytest.raises(ValueError, match="vocabulary has 96"):
        obj.prepare(torch.ones(95))


def test_objective_needs_a_draft_vocabulary_before_training(tiny8) -> None:
    obj = Eagle3Objective(tiny8, draft_vocab=32)
    batch = target_batch(tiny8, [[1, 2, 3, 4, 5]], [2], obj.taps)
    with pytest.raises(RuntimeError, match="prepare"):
        obj.loss(batch, torch.Generator())


def test_tiny_objective_learns(trained_tiny) -> None:
    objective, history = trained_tiny
    first, last = history[0], history[-1]
    assert last["loss"] < 0.5 * first["loss"]
    assert len([k for k in last if k.startswith("ce")]) == objective.ttt_steps
    for s in range(objective.ttt_steps):  # every unrolled step learns, not just step 0
        assert last[f"ce{s}"] < first[f"ce{s}"]
        assert last[f"acc{s}"] > first[f"acc{s}"]
    d2t = objective.head.d2t
    assert d2t.numel() == 64 and bool((d2t[1:] > d2t[:-1]).all())


def test_shared_trainer_export_and_drafter_round_trip(tiny8, tmp_path) -> None:
    """The shipped path: the shared Trainer picks the draft vocabulary (prepare), trains, exports int8;
    the drafter loads the export and greedy SD still equals AR."""
    from specbench.config import SpecConfig
    from specbench.engine import SpecDecoder
    from specbench.engine import generate_batch
    from specbench.train.regen import TrainingSequence, synthetic_prompt_ids
    from specbench.train.trainer import TrainConfig, Trainer

    prompts = synthetic_prompt_ids(tiny8.config.vocab_size, 6, 4, 8, seed=9)
    sequences = [TrainingSequence(p, r) for p, r in zip(prompts, generate_batch(tiny8, prompts, 16))]
    objective = Eagle3Objective(tiny8, draft_vocab=24, ttt_steps=3)
    trainer = Trainer(tiny8, {"eagle3": objective}, sequences, TrainConfig(batch_size=3, steps=4, save_every=0),
                      tmp_path / "run")
    response_ids, chosen = {t for s in sequences for t in s.response}, set(objective.head.d2t.tolist())
    assert (response_ids <= chosen) if len(response_ids) <= 24 else (chosen <= response_ids)
    trainer.train(progress=False)
    assert trainer.step == 4
    exported = trainer.export_heads(tmp_path / "heads", storage="int8")["eagle3"]
    drafter = Eagle3Drafter(tiny8, checkpoint=str(exported))
    assert torch.equal(drafter.head.d2t, objective.head.d2t)
    decoder = SpecDecoder(tiny8, SpecConfig(drafter="eagle3", tree="eagle2", budget=8), max_seq_len=96, drafter=drafter)
    ar = SpecDecoder(tiny8, SpecConfig(drafter=None), max_seq_len=96)
    assert decoder.generate(prompts[0], 24).tokens == ar.generate(prompts[0], 24).tokens
