"""The sharded training corpus: an interrupted generation finishes with exactly what an uninterrupted
one writes, shards carry their provenance, move between corpus directories, and load for training
with a held-out validation split."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specbench.engine import generate_batch
from specbench.train import corpus as C

SETTINGS = dict(sets=["synthetic:11"], max_prompt_len=12, max_new_tokens=6, temperatures=[0, 0.8, 0.8, 1.0], seed=3,
                shard_size=4)


class Stop(Exception):
    pass


def make(target, path, **over):
    return C.open_or_create(path, target, None, **{**SETTINGS, **over})


def test_interrupted_generation_equals_uninterrupted(tiny_target, tmp_path) -> None:
    whole, plan = make(tiny_target, tmp_path / "a")
    assert C.generate(tiny_target, whole, plan, gen_batch=3, log=lambda m: None) == [0, 1, 2]

    cut, plan = make(tiny_target, tmp_path / "b")
    count = {"units": 0}

    def kill_after_eight(msg: str) -> None:  # dies after its 8th unit (shard 0 has 6) was written
        count["units"] += 1
        if count["units"] == 8:
            raise Stop

    with pytest.raises(Stop):
        C.generate(tiny_target, cut, plan, gen_batch=3, log=kill_after_eight)
    assert cut.finished() == [0] and cut.partial_path(1).is_file()
    with open(cut.partial_path(1), "a") as f:
        f.write('{"batch": 1, "group": 0, "resp')  # and a line cut by the kill
    # Resumed with another --gen-batch: the started shard keeps its batches, the next uses the new one.
    assert C.generate(tiny_target, cut, plan, gen_batch=2, log=lambda m: None) == [1, 2]
    assert C.content_digest(cut.shard_path(0)) == C.content_digest(whole.shard_path(0))
    assert C.content_digest(cut.shard_path(1)) == C.content_digest(whole.shard_path(1))
    assert C.shard_meta(cut.shard_path(2))["gen_batch"] == 2
    assert not cut.partial_path(1).exists()
    for k in range(3):  # no duplicates, nothing missing: every (prompt, variant) once
        store, meta = C.load_shard(cut.shard_path(k))
        lo, hi = meta["plan_range"]
        assert store.num_prompts == hi - lo and len(store) == 4 * (hi - lo)
        assert [plan[i].id for i in range(lo, hi)] == meta["prompt_ids"]


def test_responses_follow_the_sampling_settings(tiny_target, tmp_path) -> None:
    corpus, plan = make(tiny_target, tmp_path)
    C.generate(tiny_target, corpus, plan, gen_batch=3, shards=[0], log=lambda m: None)
    store, meta = C.load_shard(corpus.shard_path(0))
    spec = meta["spec"]
    assert spec["target_fingerprint"] == tiny_target.fingerprint and spec["temperatures"] == [0, 0.8, 0.8, 1.0]
    assert spec["seed"] == 3 and meta["plan_digest"] == corpus.digest
    greedy = [store[i].response for i in range(len(store)) if int(store.variant[i]) == 0]
    prompts = [list(plan[i].tokens) for i in range(*meta["plan_range"])]
    assert greedy == [generate_batch(tiny_target, [p], 6)[0] for p in prompts]  # greedy = the target's AR greedy
    for p in range(store.num_prompts):  # the two T=0.8 samples of a prompt are separate draws
        rows = [store[i].response for i in range(len(store)) if int(store.prompt_of[i]) == p]
        assert rows[0] != rows[1] or rows[1] != rows[2]


def test_status_counts_what_the_shards_hold(tiny_target, tmp_path) -> None:
    corpus, plan = make(tiny_target, tmp_path)
    C.generate(tiny_target, corpus, plan, gen_batch=4, shards=[0, 2], log=lambda m: None)
    st = C.status(corpus)
    assert st["finished"] == [0, 2] and st["shards"] == 3 and st["plan_prompts"] == 11
    stores = [C.load_shard(corpus.shard_path(k))[0] for k in (0, 2)]
    assert st["response_tokens"] == sum(int(s.response_lengths().sum()) for s in stores)
    assert st["sequences"] == 4 * (4 + 3) and sum(v["sequences"] for v in st["by_temperature"]) == st["sequences"]
    assert st["prompt_tokens"] == sum(len(plan[i].tokens) for i in [*range(0, 4), *range(8, 11)])


def test_shards_move_between_machines(tiny_target, tmp_path) -> None:
    """Machine A makes shards 0-1, machine B shard 2; B's shard staged into A's corpus (and a fresh
    directory) gives the corpus one machine would have made."""
    a, plan = make(tiny_target, tmp_path / "a")
    C.generate(tiny_target, a, plan, gen_batch=3, shards=[0, 1], log=lambda m: None)
    b, _ = make(tiny_target, tmp_path / "b")
    C.generate(tiny_target, b, plan, gen_batch=3, shards=[2], log=lambda m: None)
    assert C.add(a.dir, [b.dir], log=lambda m: None) == [2]
    assert C.add(a.dir, [b.shard_path(2)], log=lambda m: None) == []  # identical: skipped
    fresh = tmp_path / "fresh"
    assert C.add(fresh, [a.dir], log=lambda m: None) == [0, 1, 2]
    assert C.Corpus.open(fresh).digest == a.digest
    store_a, idx_a, _ = C.load(a)
    store_f, idx_f, _ = C.load(C.Corpus.open(fresh))
    assert torch.equal(store_a.response_tokens, store_f.response_tokens) and torch.equal(idx_a, idx_f)
    other, plan_o = make(tiny_target, tmp_path / "o", seed=4)
    C.generate(tiny_target, other, plan_o, gen_batch=3, shards=[0], log=lambda m: None)
    with pytest.raises(C.CorpusError, match="another corpus"):
        C.add(a.dir, [other.shard_path(0)])


def test_settings_are_checked(tiny_target, tmp_path) -> None:
    make(tiny_target, tmp_path)
    with pytest.raises(C.CorpusError, match="max_new_tokens"):
        make(tiny_target, tmp_path, max_new_tokens=7)
    with pytest.raises(C.CorpusError, match="temperatures"):
        make(tiny_target, tmp_path / "x", temperatures=[])
    corpus, plan = make(tiny_target, tmp_path)
    with pytest.raises(C.CorpusError, match="--shards"):
        C.generate(tiny_target, corpus, plan, gen_batch=2, shards=[5])


def test_load_splits_validation_by_prompt(tiny_target, tmp_path) -> None:
    corpus, plan = make(tiny_target, tmp_path)
    C.generate(tiny_target, corpus, plan, gen_batch=4, log=lambda m: None)
    store, index, shards = C.load(corpus)
    train, val = C.split_validation(store, index, 3, corpus.spec.greedy_variant)
    assert shards == [0, 1, 2] and len(train) == 4 * 8 and len(val) == 3
    held = {tuple(plan[i].tokens) for i in range(3)}
    assert {tuple(val[i].prompt) for i in range(len(val))} == held
    assert not held & {tuple(train[i].prompt) for i in range(len(train))}
    assert all(int(v) == 0 for v in val.variant)


def test_shard_tokens_are_compact(tiny_target, tmp_path) -> None:
    corpus, plan = make(tiny_target, tmp_path)
    C.generate(tiny_target, corpus, plan, gen_batch=4, shards=[0], log=lambda m: None)
    with np.load(corpus.shard_path(0)) as z:
        assert z["response_tokens"].dtype == np.uint16 and z["prompt_tokens"].dtype == np.uint16
        assert json.loads(str(z["meta"][()]))["eos_token_ids"] == list(tiny_target.eos_token_ids)


def test_training_items_never_hold_evaluation_items() -> None:
    from pathlib import Path

    from specbench.data import training_items
    from specbench.data.benchmarks import MBPP_TEST_IDS

    data = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    if not (data / "mbpp.jsonl").is_file():
        pytest.skip(f"no benchmark data in {data}")
    mbpp = training_items("mbpp_train", data)
    assert len(mbpp) == 474 and not {int(i.split(":")[1]) for i, _ in mbpp} & set(MBPP_TEST_IDS)
    gsm = training_items("gsm8k_train", data)
    test_questions = {json.loads(line)["question"] for line in (data / "gsm8k_test.jsonl").read_text().splitlines() if line}
    assert len(gsm) == 7473 and not {t for _, t in gsm} & test_questions


def test_sample_seed_gives_fresh_samples_of_the_same_plan(tiny_target, tmp_path) -> None:
    """--sample-seed changes the sampled responses only: same plan and shards, same greedy responses (so the
    same validation split), other samples; a corpus made before the field existed reads as sample seed = seed."""
    a, plan_a = make(tiny_target, tmp_path / "a")
    b, plan_b = make(tiny_target, tmp_path / "b", sample_seed=7)
    same, _ = make(tiny_target, tmp_path / "same", sample_seed=SETTINGS["seed"])
    assert a.digest == b.digest and [e.id for e in plan_a] == [e.id for e in plan_b]
    assert same.spec == a.spec and b.spec.sampling_seed == 7 and a.spec.sampling_seed == 3
    for c, p in ((a, plan_a), (b, plan_b)):
        C.generate(tiny_target, c, p, gen_batch=4, shards=[0], log=lambda m: None)
    sa, _ = C.load_shard(a.shard_path(0))
    sb, meta_b = C.load_shard(b.shard_path(0))
    assert meta_b["spec"]["sample_seed"] == 7
    rows = [(sa[i].response, sb[i].response, int(sa.variant[i])) for i in range(len(sa))]
    assert all(ra == rb for ra, rb, v in rows if v == 0)
    assert any(ra != rb for ra, rb, v in rows if v > 0)
    with pytest.raises(C.CorpusError, match="sample_seed"):
        make(tiny_target, tmp_path / "b", sample_seed=8)
    legacy = json.loads((a.dir / C.SPEC_FILE).read_text())
    del legacy["spec"]["sample_seed"]
    (a.dir / C.SPEC_FILE).write_text(json.dumps(legacy))
    assert C.Corpus.open(a.dir).spec == a.spec
