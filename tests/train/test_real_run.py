"""A short real run on the default target (SmolLM2-135M, real training prompts): corpus generation cut
off by its time budget and resumed, and training cut off and resumed, each equal to an uninterrupted
run; the heads it exports load in their drafters."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from specbench.train.cli import main

DATA = Path(os.environ.get("SPECBENCH_DATA") or Path(__file__).resolve().parents[2] / ".." / "shared" / "data")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (DATA / "sharegpt_prompts.jsonl").is_file(), reason=f"no training data in {DATA}")]


def test_smollm2_corpus_and_training_resume_exactly(tmp_path, capsys) -> None:
    from specbench.train import corpus as C
    from specbench.train.trainer import STATE_FILE

    gen = ["corpus", "generate", "--data", str(DATA), "--max-new-tokens", "40", "--temperatures", "0,0.8",
           "--shard-size", "4", "--gen-batch", "3", "--shards", "0-2", "--quiet"]
    assert main(gen + ["--out", str(tmp_path / "whole")]) == 0
    assert main(gen + ["--out", str(tmp_path / "cut"), "--minutes", "0.05"]) == 0  # a budget cut mid-way
    cut = C.Corpus.open(tmp_path / "cut")
    assert len(cut.finished()) < 3, "the time budget should have stopped it early"
    assert main(gen + ["--out", str(tmp_path / "cut")]) == 0
    whole = C.Corpus.open(tmp_path / "whole")
    assert cut.finished() == whole.finished() == [0, 1, 2]
    for k in range(3):
        assert C.content_digest(cut.shard_path(k)) == C.content_digest(whole.shard_path(k))
    capsys.readouterr()
    assert main(["corpus", "status", str(whole.dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["sequences"] == 24 and status["spec"]["target"] == "smollm2-135m"
    assert all(i.split(":")[0] in ("gsm8k_train", "mbpp_train", "sharegpt") for k in range(3)
               for i in C.shard_meta(whole.shard_path(k))["prompt_ids"])

    train = ["train", "--drafter", "dflash,jetspec-tree,eagle3", "--corpus", str(whole.dir), "--val-prompts", "2",
             "--steps", "6", "--batch-size", "4", "--max-len", "320", "--head-arg", "dflash:anchors=8",
             "--head-arg", "jetspec-tree:anchors=8", "--head-arg", "eagle3:ttt_steps=3", "--val-every", "3",
             "--val-tau-every", "6", "--val-tau-prompts", "1", "--val-tau-budgets", "16", "--val-max-new-tokens", "24",
             "--log-every", "1", "--quiet"]
    assert main(train + ["--out", str(tmp_path / "straight")]) == 0
    assert main(train + ["--out", str(tmp_path / "resumed"), "--until-step", "3"]) == 0
    assert main(train + ["--out", str(tmp_path / "resumed")]) == 0
    a = torch.load(tmp_path / "straight" / STATE_FILE, weights_only=False)
    b = torch.load(tmp_path / "resumed" / STATE_FILE, weights_only=False)
    assert a["step"] == b["step"] == 6 and a["tokens_seen"] == b["tokens_seen"]
    for name in a["heads"]:
        for key, t in a["heads"][name].items():
            assert torch.equal(t, b["heads"][name][key]), f"{name}.{key}"
    rows = [json.loads(line) for line in (tmp_path / "straight" / "train_log.jsonl").read_text().splitlines()]
    assert any("val/eagle3/tau16" in r for r in rows) and all(r["tok_s"] > 0 for r in rows if "kind" not in r)

    from specbench.drafters import DRAFTERS
    from specbench.models import load_target

    target = load_target("smollm2-135m")
    for name in ("dflash", "jetspec-tree", "eagle3"):
        DRAFTERS.build(name, target, checkpoint=str(tmp_path / "straight" / "heads" / name))
